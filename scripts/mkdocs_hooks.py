"""mkdocs hook: the teaching notebooks live in examples/notebooks/, the site shows them under
notebooks/ (rendered by mkdocs-jupyter), so they are kept in one place.

A build renders copies of them in a temporary folder: with ``CMLRL_DOCS_EXECUTE=true``
mkdocs-jupyter runs each notebook in the folder it reads it from, and the notebooks write their
run folders (``runs/...``) beside themselves, which must not land in the checkout.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import mkdocs.plugins
from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

NOTEBOOKS = Path(__file__).resolve().parents[1] / "examples" / "notebooks"
_copies: list[Path] = []  # this build's temporary folders, removed after it


@mkdocs.plugins.event_priority(100)  # before mkdocs-jupyter turns .ipynb files into pages
def on_files(files: Files, config: MkDocsConfig) -> Files:
    build = Path(tempfile.mkdtemp(prefix="cmlrl-docs-notebooks-"))
    _copies.append(build)
    (build / "notebooks").mkdir()
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        shutil.copy2(path, build / "notebooks" / path.name)
        # src_dir + src_uri notebooks/NAME: a real source path, which mkdocs-jupyter reads (a
        # File.generated one has none once mkdocs-jupyter wraps it).
        files.append(
            File(
                f"notebooks/{path.name}",
                src_dir=str(build),
                dest_dir=config.site_dir,
                use_directory_urls=config.use_directory_urls,
            )
        )
    return files


def on_post_build(config: MkDocsConfig) -> None:
    while _copies:
        shutil.rmtree(_copies.pop(), ignore_errors=True)


def on_serve(server, config: MkDocsConfig, builder):  # noqa: ANN001, ANN201 - mkdocs' signature
    server.watch(str(NOTEBOOKS))  # the copies are rebuilt from here on each change
    return server
