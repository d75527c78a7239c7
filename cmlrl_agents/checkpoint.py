"""Trainer-agnostic checkpoints: weights, optimizers, schedulers, RNG streams and trainer state.

`save_checkpoint(root, step, ...)` writes `root/checkpoint-<step>/`:

    model-<name>.safetensors   weights (of a PeftModel: its adapter weights only)
    optim-<name>.pt            optimizer state_dict
    sched-<name>.pt            scheduler state_dict
    rng.pt                     python `random`, numpy global, torch CPU (+ CUDA) RNG states
    trainer_state.json         the manifest and the trainer's JSON state, secrets removed (B22)

The folder is built under a hidden temporary name and renamed into place when complete
(`atomic_dir`), so a crash or SIGKILL mid-save never leaves a `checkpoint-<n>` that
`latest_checkpoint` would pick, and earlier checkpoints are not touched. `.pt` files are read
back with `torch.load(weights_only=True)`: a checkpoint cannot run code when loaded.
"""

from __future__ import annotations

import json
import operator
import os
import random
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import safetensors.torch
import torch

__all__ = [
    "atomic_dir",
    "is_secret_key",
    "latest_checkpoint",
    "load_checkpoint",
    "redact_secrets",
    "save_checkpoint",
]

_FORMAT_VERSION = 1
_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
_TEMP_RE = re.compile(r"^\.checkpoint-\d+\.(?:tmp|old)-(\d+)(?:-.*)?$")
_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]+$")
_STATE_FILE = "trainer_state.json"

# A plain substring test for "token" would also drop `max_new_tokens` and `pad_token_id`, so
# "token" counts only as the last word of a key, and tokenizer special-token fields are exempt.
_SECRET_PARTS = ("api_key", "apikey", "secret", "password", "passwd", "credential", "authorization")
_TOKENIZER_FIELD = re.compile(r"^(bos|eos|pad|unk|sep|cls|mask|additional_special)_tokens?$")


def is_secret_key(key: str) -> bool:
    """Whether a config key looks like it holds a credential (API key, token, password)."""
    lowered = key.lower()
    if any(part in lowered for part in _SECRET_PARTS):
        return True
    if _TOKENIZER_FIELD.match(lowered):
        return False
    return re.split(r"[^a-z0-9]+", lowered.strip("_-. "))[-1] == "token"


def redact_secrets(obj: Any) -> Any:
    """A copy of `obj` without the mapping keys that `is_secret_key` flags, at any depth."""
    if isinstance(obj, Mapping):
        return {k: redact_secrets(v) for k, v in obj.items() if not is_secret_key(str(k))}
    if isinstance(obj, (list, tuple)):
        return [redact_secrets(v) for v in obj]
    return obj


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
    for path in root.iterdir() if root.is_dir() else ():
        match = _TEMP_RE.match(path.name)
        if match and path.is_dir() and not _process_alive(int(match.group(1))):
            shutil.rmtree(path, ignore_errors=True)


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
) -> Path:
    """Write `root/checkpoint-<step_name>/` atomically and keep only the newest `keep_last`.

    `step_name` is a non-negative int (or a string of digits): `latest_checkpoint` picks the
    largest. `trainer_state` must be JSON-serialisable with string keys (tuples come back as
    lists); keys that look like credentials are removed. The folder just written is never pruned.
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
    manifest = {
        "format_version": _FORMAT_VERSION,
        "models": {name: "peft" if _peft_adapters(m) else "full" for name, m in models.items()},
        "optimizers": sorted(optimizers),
        "schedulers": sorted(schedulers),
        "trainer_state": redact_secrets(dict(trainer_state or {})),
    }
    state_text = _to_json(manifest)  # fail on bad state before writing anything
    _remove_stale_temps(root)
    with atomic_dir(folder) as tmp:
        for name, model in models.items():
            _save_model(model, tmp / f"model-{name}.safetensors")
        for name, optimizer in optimizers.items():
            torch.save(optimizer.state_dict(), tmp / f"optim-{name}.pt")
        for name, scheduler in schedulers.items():
            torch.save(scheduler.state_dict(), tmp / f"sched-{name}.pt")
        torch.save(_rng_state(), tmp / "rng.pt")
        (tmp / _STATE_FILE).write_text(state_text, encoding="utf-8")
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


def _peft_adapters(model: torch.nn.Module) -> list[str] | None:
    # peft is only consulted when already imported: a model cannot be a PeftModel otherwise.
    peft = sys.modules.get("peft")
    if peft is None or not isinstance(model, peft.PeftModel):
        return None
    return list(model.peft_config)


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


def _rng_state() -> dict[str, Any]:
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
            doomed = path.with_name(f".{path.name}.old-{os.getpid()}")
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
    checkpoints = _complete_checkpoints(Path(root))
    return checkpoints[-1][1] if checkpoints else None


def load_checkpoint(
    path: str | Path,
    *,
    models: Mapping[str, torch.nn.Module],
    optimizers: Mapping[str, torch.optim.Optimizer] | None = None,
    schedulers: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Restore a `save_checkpoint` folder in place (weights, optimizers, schedulers, RNG).

    The names passed must be exactly the names saved. Returns the saved `trainer_state`.
    """
    path = Path(path)
    state_file = path / _STATE_FILE
    if not state_file.is_file():
        raise FileNotFoundError(
            f"{str(path)!r} is not a checkpoint folder (no {_STATE_FILE}); pass a "
            "checkpoint-<n> folder written by save_checkpoint, or latest_checkpoint(root)."
        )
    manifest = json.loads(state_file.read_text(encoding="utf-8"))
    if manifest.get("format_version") != _FORMAT_VERSION:
        raise ValueError(
            f"{state_file} has format_version {manifest.get('format_version')!r}; this version "
            f"of cmlrl reads format_version {_FORMAT_VERSION}."
        )
    optimizers, schedulers = dict(optimizers or {}), dict(schedulers or {})
    for arg, given, saved in (
        ("models", models, manifest["models"]),
        ("optimizers", optimizers, manifest["optimizers"]),
        ("schedulers", schedulers, manifest["schedulers"]),
    ):
        if sorted(given) != sorted(saved):
            raise ValueError(
                f"{arg} names {sorted(given)} do not match the names saved in {path.name}: "
                f"{sorted(saved)}; pass the same {arg} that were saved."
            )
    for name, model in models.items():
        _load_model(model, path / f"model-{name}.safetensors", name)
    for name, optimizer in optimizers.items():
        optimizer.load_state_dict(_torch_load(path / f"optim-{name}.pt"))
    for name, scheduler in schedulers.items():
        scheduler.load_state_dict(_torch_load(path / f"sched-{name}.pt"))
    _set_rng_state(_torch_load(path / "rng.pt"))
    return manifest["trainer_state"]


def _torch_load(path: Path) -> Any:
    return torch.load(path, map_location="cpu", weights_only=True)


def _load_model(model: torch.nn.Module, path: Path, name: str) -> None:
    with safetensors.safe_open(str(path), framework="pt") as f:
        metadata = f.metadata() or {}
    adapters = _peft_adapters(model)
    if metadata.get("cmlrl") != "peft":
        if adapters is not None:
            raise ValueError(
                f"{path.name} holds full weights but models[{name!r}] is a PeftModel; load it "
                "into the same kind of model that was saved."
            )
        safetensors.torch.load_model(model, str(path), strict=True)
        return
    if adapters is None:
        raise ValueError(
            f"{path.name} holds PEFT adapter weights but models[{name!r}] is a "
            f"{type(model).__name__}; wrap the base model with the same peft config first."
        )
    from peft import set_peft_model_state_dict

    tensors = safetensors.torch.load_file(str(path))
    for adapter in json.loads(metadata["adapters"]):
        if adapter not in adapters:
            raise ValueError(
                f"{path.name} has adapter {adapter!r}, models[{name!r}] has only {adapters}; "
                "add the adapter before loading."
            )
        prefix = f"{adapter}/"
        sub = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
        result = set_peft_model_state_dict(model, sub, adapter_name=adapter)
        if result.unexpected_keys:
            raise ValueError(
                f"{path.name}: adapter {adapter!r} has weights the model lacks: "
                f"{result.unexpected_keys[:5]}; use the same peft config as when saving."
            )


def _set_rng_state(state: Mapping[str, Any]) -> None:
    random.setstate(state["python"])
    np_state = state["numpy"]
    key = np.asarray(np_state["state"]["key"], dtype=np.uint32)
    np.random.set_state({**np_state, "state": {**np_state["state"], "key": key}})
    torch.set_rng_state(state["torch"])
    # A checkpoint from a GPU machine resumed on CPU keeps what it can; the reverse has no
    # CUDA streams to restore.
    if "cuda" in state and torch.cuda.is_available():
        for device, cuda_state in enumerate(state["cuda"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(cuda_state, device)
