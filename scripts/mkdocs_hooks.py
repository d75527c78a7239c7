"""mkdocs hook: the teaching notebooks live in examples/notebooks/, the site shows them under
notebooks/ (rendered by mkdocs-jupyter), so they are kept in one place."""

from __future__ import annotations

from pathlib import Path

import mkdocs.plugins
from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

NOTEBOOKS = Path(__file__).resolve().parents[1] / "examples" / "notebooks"


@mkdocs.plugins.event_priority(100)  # before mkdocs-jupyter turns .ipynb files into pages
def on_files(files: Files, config: MkDocsConfig) -> Files:
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        # src_dir examples/ + src_uri notebooks/NAME: a real source path, which mkdocs-jupyter
        # reads (a File.generated one has none once mkdocs-jupyter wraps it).
        files.append(
            File(
                f"notebooks/{path.name}",
                src_dir=str(NOTEBOOKS.parent),
                dest_dir=config.site_dir,
                use_directory_urls=config.use_directory_urls,
            )
        )
    return files
