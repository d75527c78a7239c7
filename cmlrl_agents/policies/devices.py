"""Placing models on devices: ``agent_devices``, ``critic_devices``, ``reference_devices``.

The names and forms are comlrl's (one device for every model, one per model, or ``"auto"``), so
its scripts port unchanged. A device that this machine lacks is refused at construction, before
any model is loaded. Models loaded by name go straight to their device (``device_map``): a model
meant for a GPU is never first materialised on the CPU.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["check_available", "resolve_devices"]


def resolve_devices(
    spec: str | Sequence[str] | None, count: int, field: str, what: str = "agent"
) -> list[torch.device] | None:
    """One device per model from a config's device field; None when the field is None.

    ``"auto"`` is comlrl's rule: model i on ``cuda:i`` when there are at least ``count`` GPUs,
    all on ``cuda:0`` when there are fewer, and ``cpu`` without CUDA.
    """
    if spec is None:
        return None
    if spec == "auto":
        if not torch.cuda.is_available():
            return [torch.device("cpu")] * count
        enough = torch.cuda.device_count() >= count
        return [torch.device(f"cuda:{i}" if enough else "cuda:0") for i in range(count)]
    items = [spec] if isinstance(spec, str) else list(spec)
    if len(items) not in (1, count):
        raise ValueError(
            f"{field} has {len(items)} devices for {count} {what}(s); give one device for all "
            f"or exactly one per {what}."
        )
    devices = [torch.device(item) for item in items]
    for device in devices:
        check_available(device, field)
    return devices * count if len(devices) == 1 else devices


def check_available(device: torch.device, field: str) -> None:
    """Refuse a CUDA or MPS device that this machine does not have, and ``meta`` (tensors
    without data: a model there could neither generate nor train)."""
    if device.type == "meta":
        raise ValueError(
            f"{field} asks for meta, a device whose tensors hold no data, so a model there "
            "can neither generate nor train; use 'cpu', 'cuda:0', ... or 'auto'."
        )
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = 0 if device.index is None else device.index
        if index >= count:
            raise ValueError(
                f"{field} asks for {device} but this machine has {count} CUDA device(s); use "
                f"{'cpu' if count == 0 else f'cuda:0 .. cuda:{count - 1}'} or 'auto'."
            )
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"{field} asks for mps, which this machine does not have; use 'cpu'.")
