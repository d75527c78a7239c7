"""The docs build renders the notebooks from copies in a temporary folder, so that an executed
build (CMLRL_DOCS_EXECUTE=true) writes the notebooks' run folders there, not into the checkout."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

from mkdocs.structure.files import Files

ROOT = Path(__file__).resolve().parents[1]


def load_hooks():
    spec = importlib.util.spec_from_file_location(
        "mkdocs_hooks", ROOT / "scripts" / "mkdocs_hooks.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_notebooks_are_rendered_from_a_temporary_copy(tmp_path) -> None:
    hooks = load_hooks()
    config = SimpleNamespace(site_dir=str(tmp_path / "site"), use_directory_urls=True)
    files = hooks.on_files(Files([]), config)
    notebooks = sorted((ROOT / "examples" / "notebooks").glob("*.ipynb"))
    rendered = [f for f in files if f.src_uri.startswith("notebooks/")]
    assert [f.src_uri for f in rendered] == [f"notebooks/{p.name}" for p in notebooks]
    copies = {Path(f.abs_src_path) for f in rendered}
    for copy, original in zip(sorted(copies), notebooks, strict=True):
        assert ROOT not in copy.parents  # executed there, its runs/ stay out of the checkout
        assert copy.read_bytes() == original.read_bytes()
    hooks.on_post_build(config)
    assert not any(copy.exists() for copy in copies)
