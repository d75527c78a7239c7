"""Reading checkpoints back: verify every file, then restore (see
:mod:`cmlrl_agents.runs.checkpoint`).

Nothing is changed until the whole folder has been checked: SHA-256 of each file against the
manifest, tensor names and shapes against the model, optimizer groups against the optimizer.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import safetensors
import safetensors.torch
import torch

if TYPE_CHECKING:
    from torch.nn.modules.module import _IncompatibleKeys

__all__ = ["CheckpointError", "load_checkpoint", "read_checkpoint"]

# 2: the manifest records a SHA-256 per file, verified before anything is loaded.
_FORMAT_VERSION = 3
_STATE_FILE = "trainer_state.json"


def _peft_adapters(model: torch.nn.Module) -> list[str] | None:
    # peft is only consulted when already imported: a model cannot be a PeftModel otherwise.
    peft = sys.modules.get("peft")
    if peft is None or not isinstance(model, peft.PeftModel):
        return None
    return list(model.peft_config)


class CheckpointError(ValueError):
    """A checkpoint folder is damaged, incomplete or does not fit what it is loaded into."""


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """The manifest of a checkpoint folder (its `trainer_state`, part names and checksums),
    after verifying every file against its recorded SHA-256; loads nothing into any model."""
    path = Path(path)
    state_file = path / _STATE_FILE
    if not state_file.is_file():
        raise FileNotFoundError(
            f"{str(path)!r} is not a checkpoint folder (no {_STATE_FILE}); pass a "
            "checkpoint-<n> folder written by save_checkpoint, or latest_checkpoint(root)."
        )
    try:
        manifest = json.loads(state_file.read_text(encoding="utf-8"))
        version = manifest.get("format_version")
    except (UnicodeDecodeError, json.JSONDecodeError, AttributeError) as exc:
        raise _damaged(state_file, f"it is not valid JSON ({exc})") from None
    if version != _FORMAT_VERSION:
        raise CheckpointError(
            f"{state_file} has format_version {version!r}; this version of cmlrl reads "
            f"format_version {_FORMAT_VERSION}."
        )
    for name, digest in manifest["files"].items():
        file = path / name
        if not file.is_file():
            raise _damaged(file, "it is missing")
        if _sha256(file) != digest:
            raise _damaged(file, "its SHA-256 differs from the one recorded when it was saved")
    return manifest


def load_checkpoint(
    path: str | Path,
    *,
    models: Mapping[str, torch.nn.Module],
    optimizers: Mapping[str, torch.optim.Optimizer] | None = None,
    schedulers: Mapping[str, Any] | None = None,
    check: Callable[[dict[str, Any]], None] | None = None,
    rank: int = 0,
    world_size: int = 1,
    weights_only: bool = False,
) -> dict[str, Any]:
    """Restore a `save_checkpoint` folder in place (weights, optimizers, schedulers, and the
    RNG state of process ``rank`` of a launch of ``world_size``, which must be the launch's
    that saved it). ``weights_only`` restores the models alone (the best model, an export).

    The names passed must be exactly the names saved. Everything is verified (checksums,
    tensor names and shapes, optimizer groups, and `check(trainer_state)` when given, which
    raises to refuse the checkpoint) before the first model changes, so an error leaves every
    model and optimizer as it was. Returns the saved `trainer_state`.
    """
    path = Path(path)
    manifest = read_checkpoint(path)
    if check is not None:
        check(manifest["trainer_state"])
    if not weights_only:
        _check_resumable(path, manifest, world_size)
    optimizers, schedulers = dict(optimizers or {}), dict(schedulers or {})
    parts: list[tuple[str, Mapping[str, object], Any]] = [("models", models, manifest["models"])]
    if not weights_only:
        parts += [
            ("optimizers", optimizers, manifest["optimizers"]),
            ("schedulers", schedulers, manifest["schedulers"]),
        ]
    for arg, given, saved in parts:
        if sorted(given) != sorted(saved):
            raise CheckpointError(
                f"{arg} names {sorted(given)} do not match the names saved in {path.name}: "
                f"{sorted(saved)}; pass the same {arg} that were saved."
            )
    for name, model in models.items():
        _check_model_file(model, path / f"model-{name}.safetensors", name)
    optim_states = {n: _torch_load(path / f"optim-{n}.pt") for n in optimizers}
    for name, optimizer in optimizers.items():
        _check_optimizer_state(optimizer, optim_states[name], path / f"optim-{name}.pt")
    sched_states = {n: _torch_load(path / f"sched-{n}.pt") for n in schedulers}
    rng = None if weights_only else _torch_load(path / f"rng-rank{rank}.pt")
    # Nothing below can fail on the checkpoint's account.
    for name, model in models.items():
        _load_model(model, path / f"model-{name}.safetensors", name)
    if rng is None:
        return manifest["trainer_state"]
    for name, optimizer in optimizers.items():
        optimizer.load_state_dict(optim_states[name])
    for name, scheduler in schedulers.items():
        scheduler.load_state_dict(sched_states[name])
    _set_rng_state(rng)
    return manifest["trainer_state"]


def _check_resumable(path: Path, manifest: Mapping[str, Any], world_size: int) -> None:
    if manifest.get("weights_only"):
        raise CheckpointError(
            f"{path.name} was saved with save_only_model=True: it holds the weights alone (no "
            "optimizer or RNG state), so a run cannot resume from it; evaluate it or export "
            "it with save_model, or resume from a full checkpoint."
        )
    if manifest["ranks"] != world_size:
        raise CheckpointError(
            f"{path.name} was saved by a launch of {manifest['ranks']} process(es) and this one "
            f"has {world_size}: each process resumes its own random streams, so resume it with "
            f"{manifest['ranks']} process(es)."
        )


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _damaged(file: Path, why: str) -> CheckpointError:
    return CheckpointError(
        f"checkpoint file {file} is damaged: {why}. Resume from another checkpoint of the run "
        "(e.g. an earlier checkpoint-<n>), or delete this checkpoint folder."
    )


def _torch_load(path: Path) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any failure here means the file is unreadable
        # The exception's own text advises weights_only=False, which would let the file run
        # code; it is not passed on.
        raise _damaged(path, f"torch.load cannot read it ({type(exc).__name__})") from None


def _check_model_file(model: torch.nn.Module, path: Path, name: str) -> None:
    """The file's kind (full / PEFT) and, for full weights, its tensor names and shapes fit."""
    try:
        with safetensors.safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
            shapes = {key: tuple(f.get_slice(key).get_shape()) for key in f.keys()}
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types
        raise _damaged(path, f"safetensors cannot read it ({type(exc).__name__})") from None
    adapters = _peft_adapters(model)
    if metadata.get("cmlrl") != "peft":
        if adapters is not None:
            raise CheckpointError(
                f"{path.name} holds full weights but models[{name!r}] is a PeftModel; load it "
                "into the same kind of model that was saved."
            )
        expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        wrong = sorted(k for k, shape in shapes.items() if expected.get(k) != shape)
        if wrong:
            key = wrong[0]
            raise CheckpointError(
                f"{path.name} does not fit models[{name!r}]: {len(wrong)} tensor(s) differ, "
                f"e.g. {key!r} is {shapes[key]} in the file and {expected.get(key)} in the "
                "model; load it into the same architecture that was saved."
            )
        return
    if adapters is None:
        raise CheckpointError(
            f"{path.name} holds PEFT adapter weights but models[{name!r}] is a "
            f"{type(model).__name__}; wrap the base model with the same peft config first."
        )
    missing = [a for a in json.loads(metadata["adapters"]) if a not in adapters]
    if missing:
        raise CheckpointError(
            f"{path.name} has adapter(s) {missing}, models[{name!r}] has only {adapters}; "
            "add the adapters before loading."
        )


def _check_optimizer_state(optimizer: torch.optim.Optimizer, state: Any, path: Path) -> None:
    groups = state.get("param_groups") if isinstance(state, Mapping) else None
    if not isinstance(groups, list):
        raise _damaged(path, "it holds no optimizer state_dict")
    saved = [len(g["params"]) for g in groups]
    current = [len(g["params"]) for g in optimizer.param_groups]
    if saved != current:
        raise CheckpointError(
            f"{path.name} holds an optimizer over parameter groups of sizes {saved}, this "
            f"optimizer has {current}; load it into the same trainable parameters that were saved."
        )


def _load_model(model: torch.nn.Module, path: Path, name: str) -> None:
    if _peft_adapters(model) is None:
        safetensors.torch.load_model(model, str(path), strict=True)
        return
    from peft import set_peft_model_state_dict

    with safetensors.safe_open(str(path), framework="pt") as f:
        adapters = json.loads((f.metadata() or {})["adapters"])
    tensors = safetensors.torch.load_file(str(path))
    for adapter in adapters:
        prefix = f"{adapter}/"
        sub = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
        # peft annotates its result as ``namedtuple``, which is no type: torch's is the real one.
        result: _IncompatibleKeys = set_peft_model_state_dict(model, sub, adapter_name=adapter)
        if result.unexpected_keys:
            raise CheckpointError(
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
