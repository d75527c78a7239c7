"""Test-wide settings: never reach a model hub, never log to W&B online."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


import pytest  # noqa: E402 - after the environment settings above

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Where a run folder lands when a test forgets output_dir or tmp_path (trainers default to
# runs/<...> in the working folder): tests and builds write to temporary folders only.
_RUN_FOLDERS = ("runs", os.path.join("examples", "notebooks", "runs"))


def _files_under(folders: tuple[str, ...]) -> set[str]:
    found = set()
    for folder in folders:
        for parent, _, names in os.walk(os.path.join(ROOT, folder)):
            found.update(os.path.join(parent, name) for name in names)
    return found


@pytest.fixture(scope="session", autouse=True)
def no_run_folders_left_in_the_checkout():
    before = _files_under(_RUN_FOLDERS)
    yield
    left = sorted(_files_under(_RUN_FOLDERS) - before)
    assert not left, f"tests wrote into the checkout (use tmp_path): {left[:5]}"
