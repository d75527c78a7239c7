"""Trainer-agnostic checkpoints: weights, optimizers, schedulers, RNG streams and trainer state.

`save_checkpoint(root, step, ...)` writes `root/checkpoint-<step>/`:

    model-<name>.safetensors   weights (of a PeftModel: its adapter weights only)
    optim-<name>.pt            optimizer state_dict
    sched-<name>.pt            scheduler state_dict
    rng-rank<r>.pt             per process of the launch: python `random`, numpy global, torch
                               CPU (+ CUDA) RNG states (none in a weights-only checkpoint)
    trainer_state.json         the manifest and the trainer's JSON state, secrets removed (B22)

The folder is built under a hidden temporary name and renamed into place when complete
(`atomic_dir`), so a crash or SIGKILL mid-save never leaves a `checkpoint-<n>` that
`latest_checkpoint` would pick, and earlier checkpoints are not touched. Replacing a checkpoint
of the same step (the end of `train()` saves again) renames the old folder aside first; a crash
between that rename and the next is repaired by the next `latest_checkpoint` or save, which
puts the old folder back.

`trainer_state.json` records a SHA-256 per file. `load_checkpoint` verifies every file, its
tensor names and shapes and its optimizer groups before it changes anything, so a damaged
checkpoint raises `CheckpointError` naming the file and leaves the models as they were. `.pt`
files are read back with `torch.load(weights_only=True)`: a checkpoint cannot run code when
loaded.
"""

from __future__ import annotations

import json
import operator
import os
import random
import re
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import safetensors.torch
import torch

from cmlrl_agents.runs.checkpoint_load import (
    _FORMAT_VERSION,
    _STATE_FILE,
    CheckpointError,
    _peft_adapters,
    _sha256,
    load_checkpoint,
    read_checkpoint,
)
from cmlrl_agents.runs.redaction import is_secret_key, redact_secrets

__all__ = [
    "CheckpointError",
    "atomic_dir",
    "is_secret_key",
    "latest_checkpoint",
    "load_checkpoint",
    "read_checkpoint",
    "redact_secrets",
    "save_checkpoint",
]

_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
_TEMP_RE = re.compile(r"^\.checkpoint-\d+\.(?:tmp|old|del)-(\d+)(?:-.*)?$")
_REPLACED_RE = re.compile(r"^\.(checkpoint-\d+)\.old-(\d+)$")
_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]+$")

# ---- atomic directories ---------------------------------------------------------------------


@contextmanager
def atomic_dir(final_path: str | Path) -> Iterator[Path]:
    """Yield a temporary sibling folder; on success fsync it and rename it to `final_path`.

    On an exception the temporary folder is removed and `final_path` (if it existed) is left as
    it was. An existing `final_path` is replaced; only a crash between the two renames of that
    replacement can leave it missing (its old content then sits in `.<name>.old-<pid>`).
    """
    final = Path(final_path)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-{os.getpid()}-", dir=final.parent))
    old = final.with_name(f".{final.name}.old-{os.getpid()}")
    try:
        yield tmp
        _fsync_tree(tmp)
        if final.exists():
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old)
        else:
            os.replace(tmp, final)
        _fsync_dir(final.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old.exists() and not final.exists():  # failed between the two renames
            os.replace(old, final)
        raise


def _fsync_tree(folder: Path) -> None:
    for path in sorted(folder.rglob("*"), reverse=True):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
        else:
            _fsync_dir(path)
    _fsync_dir(folder)


def _fsync_dir(folder: Path) -> None:
    if os.name != "posix":  # directories cannot be opened for fsync on Windows
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove_stale_temps(root: Path) -> None:
    """Delete temporary folders left by saves whose process died (e.g. SIGKILL mid-save)."""
    _restore_replaced(root)
    for path in root.iterdir() if root.is_dir() else ():
        match = _TEMP_RE.match(path.name)
        if match and path.is_dir() and not _process_alive(int(match.group(1))):
            shutil.rmtree(path, ignore_errors=True)


def _restore_replaced(root: Path) -> None:
    """Put back a checkpoint that a dead process renamed aside to replace it (`atomic_dir`'s
    window between its two renames): without this, a kill there with `keep_last=1` would leave
    no complete checkpoint at all."""
    for path in root.iterdir() if root.is_dir() else ():
        match = _REPLACED_RE.match(path.name)
        if not match or _process_alive(int(match.group(2))):
            continue
        final = root / match.group(1)
        if not final.exists() and (path / _STATE_FILE).is_file():
            os.replace(path, final)


def _process_alive(pid: int) -> bool:
    if os.name != "posix":  # os.kill(pid, 0) would terminate the process on Windows
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # it exists but belongs to another user
        return True
    return True


# ---- save -----------------------------------------------------------------------------------


def save_checkpoint(
    root: str | Path,
    step_name: int | str,
    *,
    models: Mapping[str, torch.nn.Module],
    optimizers: Mapping[str, torch.optim.Optimizer] | None = None,
    schedulers: Mapping[str, Any] | None = None,
    trainer_state: Mapping[str, Any] | None = None,
    keep_last: int | None = None,
    rng_states: Sequence[Mapping[str, Any]] | None = None,
    weights_only: bool = False,
) -> Path:
    """Write `root/checkpoint-<step_name>/` atomically and keep only the newest `keep_last`.

    `step_name` is a non-negative int (or a string of digits): `latest_checkpoint` picks the
    largest. `trainer_state` must be JSON-serialisable with string keys (tuples come back as
    lists); keys that look like credentials are removed. The folder just written is never pruned.
    ``rng_states`` holds each rank's RNG state (:func:`rng_state`; default: this process's);
    ``weights_only`` writes the models alone (no optimizer, scheduler or RNG state: such a
    checkpoint can be evaluated or exported, not resumed).
    """
    root = Path(root)
    folder = root / f"checkpoint-{_check_step_name(step_name)}"
    optimizers, schedulers = dict(optimizers or {}), dict(schedulers or {})
    _check_parts("models", models, torch.nn.Module)
    _check_parts("optimizers", optimizers, torch.optim.Optimizer)
    _check_parts("schedulers", schedulers, None)
    if keep_last is not None and (
        isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1
    ):
        raise ValueError(f"keep_last must be None (keep all) or an int >= 1, got {keep_last!r}.")
    if weights_only:
        optimizers, schedulers = {}, {}
    rngs = [] if weights_only else [rng_state()] if rng_states is None else list(rng_states)
    manifest = {
        "format_version": _FORMAT_VERSION,
        "weights_only": weights_only,
        "ranks": len(rngs),
        "models": {name: "peft" if _peft_adapters(m) else "full" for name, m in models.items()},
        "optimizers": sorted(optimizers),
        "schedulers": sorted(schedulers),
        "trainer_state": redact_secrets(dict(trainer_state or {})),
    }
    _to_json(manifest)  # fail on bad state before writing anything
    _remove_stale_temps(root)
    with atomic_dir(folder) as tmp:
        for name, model in models.items():
            _save_model(model, tmp / f"model-{name}.safetensors")
        for name, optimizer in optimizers.items():
            torch.save(optimizer.state_dict(), tmp / f"optim-{name}.pt")
        for name, scheduler in schedulers.items():
            torch.save(scheduler.state_dict(), tmp / f"sched-{name}.pt")
        for rank, state in enumerate(rngs):
            torch.save(state, tmp / f"rng-rank{rank}.pt")
        manifest["files"] = {p.name: _sha256(p) for p in sorted(tmp.iterdir())}
        (tmp / _STATE_FILE).write_text(_to_json(manifest), encoding="utf-8")
    if keep_last is not None:
        _prune(root, keep_last, keep=folder)
    return folder


def _check_step_name(step_name: int | str) -> int:
    if isinstance(step_name, str) and step_name.isdigit():
        return int(step_name)
    if not isinstance(step_name, (bool, str)) and hasattr(step_name, "__index__"):
        if operator.index(step_name) >= 0:
            return operator.index(step_name)
    raise ValueError(
        f"step_name must be a non-negative int (e.g. the env_step or the item index), got "
        f"{step_name!r}; checkpoints are named checkpoint-<int> so the newest can be found."
    )


def _check_parts(arg: str, parts: Mapping[str, Any], kind: type | None) -> None:
    if not isinstance(parts, Mapping):
        raise TypeError(f"{arg} must be a dict of name -> object, got {type(parts).__name__}.")
    for name, part in parts.items():
        if not isinstance(name, str) or not _NAME_RE.match(name):
            raise ValueError(
                f"{arg} key {name!r} is not a valid file-name part; use letters, digits, '_', "
                "'-' or '.' (e.g. 'agent_0')."
            )
        if kind is not None and not isinstance(part, kind):
            raise TypeError(f"{arg}[{name!r}] must be a {kind.__name__}, got {type(part)}.")
        if kind is None and not hasattr(part, "state_dict"):
            raise TypeError(f"{arg}[{name!r}] has no state_dict(); pass a torch LR scheduler.")


def _to_json(manifest: dict[str, Any]) -> str:
    problem = _json_problem(manifest["trainer_state"], "trainer_state")
    if problem:
        raise TypeError(f"{problem}; store plain JSON data (str keys, numbers, lists, dicts).")
    return json.dumps(manifest, indent=2) + "\n"


def _json_problem(obj: Any, where: str) -> str | None:
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return None
    if isinstance(obj, Mapping):
        for key, value in obj.items():
            if not isinstance(key, str):
                return f"{where} has key {key!r} of type {type(key).__name__}; JSON keys are str"
            problem = _json_problem(value, f"{where}[{key!r}]")
            if problem:
                return problem
        return None
    if isinstance(obj, (list, tuple)):
        return next(
            (p for i, v in enumerate(obj) if (p := _json_problem(v, f"{where}[{i}]"))), None
        )
    return f"{where} is a {type(obj).__name__} ({str(obj)[:80]!r}), which JSON cannot store"


def _save_model(model: torch.nn.Module, path: Path) -> None:
    adapters = _peft_adapters(model)
    if adapters is None:
        # save_model (not save_file) drops duplicate names of tied weights, which save_file
        # refuses; load_model re-ties them.
        safetensors.torch.save_model(model, str(path), metadata={"cmlrl": "full"})
        return
    from peft import get_peft_model_state_dict

    tensors = {
        f"{adapter}/{key}": value.detach().contiguous()
        for adapter in adapters
        for key, value in get_peft_model_state_dict(model, adapter_name=adapter).items()
    }
    metadata = {"cmlrl": "peft", "adapters": json.dumps(adapters)}
    safetensors.torch.save_file(tensors, str(path), metadata=metadata)


def rng_state() -> dict[str, Any]:
    """This process's python, numpy, torch CPU (and CUDA) RNG states."""
    np_state = np.random.get_state(legacy=False)
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            **np_state,
            "state": {**np_state["state"], "key": np_state["state"]["key"].tolist()},
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _prune(root: Path, keep_last: int, *, keep: Path) -> None:
    checkpoints = _complete_checkpoints(root)
    for _, path in checkpoints[:-keep_last]:
        if path != keep:
            # Rename first: a crash mid-delete then leaves a hidden folder, not a broken checkpoint.
            doomed = path.with_name(f".{path.name}.del-{os.getpid()}")
            os.replace(path, doomed)
            shutil.rmtree(doomed, ignore_errors=True)


# ---- load -----------------------------------------------------------------------------------


def _complete_checkpoints(root: Path) -> list[tuple[int, Path]]:
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        match = _CHECKPOINT_RE.match(path.name)
        if match and (path / _STATE_FILE).is_file():
            found.append((int(match.group(1)), path))
    return sorted(found)


def latest_checkpoint(root: str | Path) -> Path | None:
    """The complete `checkpoint-<n>` under `root` with the largest n, or None if there is none."""
    _restore_replaced(Path(root))
    checkpoints = _complete_checkpoints(Path(root))
    return checkpoints[-1][1] if checkpoints else None
