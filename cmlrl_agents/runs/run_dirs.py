"""What makes a run a run: its folder, its identity, and which checkpoints belong to it.

A run folder holds one run. A fresh ``train()`` in a folder whose checkpoints belong to another
run is refused (unless ``overwrite_output_dir=True``, which deletes them, or a resume), so that
``resume_from_checkpoint="latest"`` can never pick up a stranger's weights. Each trainer has a
random ``run_id``, written into its checkpoints and adopted on resume.

A checkpoint also records the run's *identity*: what must be equal for its weights and
position to mean anything in the trainer that resumes it (algorithm, team size, models,
``num_generations``, ``num_turns``, training data). :func:`identity_mismatch` compares two
identities before any weight is loaded; every other field (learning rates, epochs, logging,
evaluation) may change on resume and takes effect.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from datasets import Dataset, IterableDataset

from cmlrl_agents.policies.agent import LLMAgent

__all__ = [
    "check_identity",
    "clear_checkpoints",
    "dataset_fingerprint",
    "default_run_dir",
    "foreign_checkpoints",
    "identity_mismatch",
    "model_name",
    "new_run_id",
]

_STATE_FILE = "trainer_state.json"


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


def default_run_dir(algorithm: str, run_id: str) -> Path:
    """``runs/<algorithm>-<date>-<time>-<run id>``: unique even for trainers built in the same
    second (the time alone was not)."""
    return Path("runs") / f"{algorithm}-{time.strftime('%Y%m%d-%H%M%S')}-{run_id[:6]}"


def model_name(spec: Any) -> str:
    """A model's hub id or folder: the string it was given as, or what ``from_pretrained``
    recorded in its config; the class name for a model built in memory."""
    if isinstance(spec, str):
        return spec
    model = spec.model if isinstance(spec, LLMAgent) else spec
    config = getattr(model, "config", None)  # a third-party object: it may have no config
    name = getattr(config, "_name_or_path", None)
    return str(name) if name else type(model).__name__


def dataset_fingerprint(data: Dataset | IterableDataset | None) -> str | None:
    """The ``datasets`` fingerprint of a map-style dataset (the same for the same data and
    operations, across processes); None for a streamed dataset, which has none."""
    if isinstance(data, Dataset):
        return f"{data._fingerprint}:{len(data)}"
    return None


def identity_mismatch(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """``field: saved -> current`` for each identity field that differs (an unknown dataset
    fingerprint on either side is not compared)."""
    problems = []
    for key in sorted(set(saved) | set(current)):
        old, new = saved.get(key), current.get(key)
        if key == "train_dataset" and (old is None or new is None):
            continue
        if old != new:
            problems.append(f"{key}: {json.dumps(old)} in the checkpoint, {json.dumps(new)} now")
    return problems


def check_identity(saved: Mapping[str, Any], current: Mapping[str, Any], path: Path) -> None:
    """Raise naming every field that makes resuming ``path`` into this trainer meaningless."""
    problems = identity_mismatch(saved, current)
    if problems:
        raise ValueError(
            f"cannot resume from {path}: it belongs to a different run setup ("
            + "; ".join(problems)
            + "). These must be equal to resume; fields such as learning rates, epochs and "
            "logging may change. Build the trainer as the run was built, or start a new run "
            "in another output_dir."
        )


def foreign_checkpoints(root: Path, run_id: str) -> list[Path]:
    """The checkpoint folders under ``root`` written by a run other than ``run_id``."""
    found = []
    for path in sorted(root.glob("checkpoint-*")) if root.is_dir() else ():
        state_file = path / _STATE_FILE
        if not state_file.is_file():
            continue
        try:
            state = json.loads(state_file.read_text(encoding="utf-8"))["trainer_state"]
            owner = state["run"]["run_id"]
        except (ValueError, KeyError, TypeError):
            owner = None  # unreadable or older: not ours either
        if owner != run_id:
            found.append(path)
    return found


def clear_checkpoints(paths: Sequence[Path]) -> None:
    """Delete checkpoint folders (renamed aside first, so a crash never leaves half of one)."""
    for path in paths:
        doomed = path.with_name(f".{path.name}.del-{os.getpid()}")
        os.replace(path, doomed)
        shutil.rmtree(doomed, ignore_errors=True)
