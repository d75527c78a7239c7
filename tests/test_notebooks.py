"""The teaching notebooks: stored without outputs, and each runs top to bottom on the tiny model.

Each notebook checks its own claims with ``assert`` cells (a reward worked out by hand equals the
env's; the by-hand MAGRPO loss equals the trainer's; ...), so running it is the test. They run in
a fresh kernel in a temporary folder, which is where their run folders go.
"""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "examples" / "notebooks"
NAMES = ["01_env", "02_magrpo_by_hand", "03_train_a_team", "04_multi_turn"]
# What each notebook must leave in its working folder.
RUN_FILES = {
    "01_env": [],
    "02_magrpo_by_hand": ["runs/magrpo-by-hand/trees/env_step-000000.html"],
    "03_train_a_team": ["runs/team/metrics.jsonl", "runs/one-agent/rewards.png"],
    "04_multi_turn": ["runs/two-turns/trees/env_step-000000.png", "runs/two-turns/rewards.png"],
}
SWITCH = 'MODEL = "tiny"  # "smollm2" in class'


def read(name: str) -> nbformat.NotebookNode:
    return nbformat.read(FOLDER / f"{name}.ipynb", as_version=4)


def test_the_four_notebooks_are_there():
    assert sorted(p.stem for p in FOLDER.glob("*.ipynb")) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_stored_with_outputs_stripped_and_one_line_model_switch(name):
    notebook = read(name)
    nbformat.validate(notebook)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert all(not cell.outputs and cell.execution_count is None for cell in code)
    switches = [cell for cell in code if SWITCH in cell.source]
    # The env notebook needs no model; the others switch to SmolLM2 with one line.
    assert len(switches) == (0 if name == "01_env" else 1)


@pytest.mark.parametrize("name", NAMES)
def test_runs_top_to_bottom(name, tmp_path, monkeypatch):
    # The kernel is a new process started in tmp_path: give it this checkout's packages.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    notebook = read(name)
    client = NotebookClient(
        notebook,
        timeout=300,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute()
    errors = [o for c in notebook.cells for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors
    for relative in RUN_FILES[name]:
        assert (tmp_path / relative).is_file(), relative
