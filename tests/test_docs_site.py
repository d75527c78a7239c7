"""The documentation site builds with ``mkdocs build --strict`` (a warning, a broken link or a
missing API reference fails it) and holds the guides, the rendered notebooks, the tasks and an
API reference of every public name; the rollout-tree picture's command runs; the site's own
Python block runs."""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import cmlrl_agents
import cmlrl_env
import cmlrl_env.tasks

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "CMLRL_DOCS_EXECUTE": "false"}
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "WARNING" not in proc.stderr, proc.stderr[-4000:]
    return out


def test_the_site_holds_the_guides_notebooks_and_tasks(site):
    for page in ("env", "experiments", "design", "rollout-tree", "tasks", "training"):
        assert (site / page / "index.html").is_file(), page
    for page in ("benchmarks", "comlrl", "distributed", "preference"):
        assert (site / page / "index.html").is_file(), page
    for notebook in sorted((ROOT / "examples" / "notebooks").glob("*.ipynb")):
        html = (site / "notebooks" / notebook.stem / "index.html").read_text("utf-8")
        assert "MAGRPO" in html or "CoMLRLEnv" in html
    assert (site / "images" / "rollout-tree.png").is_file()
    tasks = (site / "tasks" / "index.html").read_text("utf-8")
    for name in cmlrl_env.tasks.__all__:
        if callable(getattr(cmlrl_env.tasks, name)):
            assert f'id="cmlrl_env.tasks.{name}"' in tasks, name


@pytest.mark.parametrize("package", [cmlrl_env, cmlrl_agents], ids=lambda p: p.__name__)
def test_the_api_reference_covers_every_public_name(site, package):
    html = (site / "api" / package.__name__ / "index.html").read_text("utf-8")
    documented = set(re.findall(rf'id="{package.__name__}\.(\w+)"', html))
    assert set(package.__all__) <= documented, sorted(set(package.__all__) - documented)


def test_the_rollout_tree_page_block_runs(tmp_path, monkeypatch):
    text = (ROOT / "docs" / "rollout-tree.md").read_text("utf-8")
    blocks = re.findall(r"^```python\n(.*?)^```$", text, flags=re.S | re.M)
    assert len(blocks) == 1
    monkeypatch.chdir(tmp_path)
    with contextlib.redirect_stdout(io.StringIO()) as out:
        exec(compile(blocks[0], "docs/rollout-tree.md", "exec"), {"__name__": "docs"})
    # "Short." (6) vs 15, 19, 23 characters: ratios 2.5, 3.17 -> 3, 3.83 -> 3, divided by 3
    assert out.getvalue().splitlines()[0].startswith("1 ('Short.', 'A longer answer') 0.833")
    assert (tmp_path / "tree.png").is_file() and (tmp_path / "tree.html").is_file()


def test_the_readme_picture_command_runs(tmp_path):
    """The committed picture comes from this command (scripted agents, no model)."""
    output = tmp_path / "rollout-tree.png"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "rollout_tree.py"), "--output", str(output)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert output.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = output.with_suffix(".html").read_text("utf-8")
    assert page.count('class="node ended"') == 1  # the branch that reached the target at turn 1
    assert page.count('<li class="node') == 3 + 2 * 3
    readme = (ROOT / "README.md").read_text("utf-8")
    assert "![The rollout tree of one MAGRPO round](docs/images/rollout-tree.png)" in readme
    assert "python examples/rollout_tree.py --output docs/images/rollout-tree.png" in readme
