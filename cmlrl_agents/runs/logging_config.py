"""The logger's run config and W&B settings: checked at construction, made JSON-safe.

Kept apart from :mod:`cmlrl_agents.runs.logging`, which aggregates and writes metrics.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cmlrl_agents.runs.progress import LINES
from cmlrl_agents.runs.redaction import redact_secrets

__all__ = [
    "WANDB_CONFIG_KEYS",
    "check_wandb_config",
    "jsonable",
    "merge_config",
    "resolve_verbose",
]

# `id` and `resume` are accepted because the reference accepted them (continuing a W&B run).
WANDB_CONFIG_KEYS = (
    *("project", "entity", "name", "run_name", "tags", "dir", "config_sections"),
    *("mode", "id", "resume"),
)
_WANDB_MODES = ("online", "offline", "disabled")


def jsonable(obj: Any) -> Any:
    """Best-effort JSON form of a run config: configs may carry paths, dataclasses, callables."""
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in obj]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return jsonable(dataclasses.asdict(obj))
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "item") and callable(obj.item):  # numpy / torch scalars
        try:
            return jsonable(obj.item())
        except (TypeError, ValueError, RuntimeError):
            pass
    return repr(obj)


def merge_config(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """Deep merge; on a clash the value in `base` (the run config: what actually ran) wins."""
    merged = dict(extra)
    for key, value in base.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merge_config(dict(value), merged[key])
        else:
            merged[key] = value
    return merged


def check_wandb_config(config: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(config, Mapping):
        raise TypeError(
            f"wandb_config must be a dict or None, got {type(config).__name__}: {config!r}; "
            f"pass a dict with keys from {list(WANDB_CONFIG_KEYS)} or None to disable W&B."
        )
    unknown = sorted(str(k) for k in config if k not in WANDB_CONFIG_KEYS)
    if unknown:
        raise ValueError(
            f"wandb_config has unknown key(s) {unknown}; valid keys are {list(WANDB_CONFIG_KEYS)}."
        )
    # A credential pasted into a name or a tag would reach W&B's servers as it is.
    cfg = {k: v if k == "config_sections" else redact_secrets(v) for k, v in config.items()}
    name, run_name = cfg.pop("name", None), cfg.pop("run_name", None)
    if name is not None and run_name is not None and name != run_name:
        raise ValueError(
            f"wandb_config gives name={name!r} and run_name={run_name!r}; they are aliases, "
            "give one of them."
        )
    cfg["name"] = name if name is not None else run_name
    tags = cfg.get("tags")
    if tags is not None and not (
        isinstance(tags, (list, tuple)) and all(isinstance(t, str) for t in tags)
    ):
        raise ValueError(f"wandb_config['tags'] must be a list of strings, got {tags!r}.")
    sections = cfg.get("config_sections")
    if sections is None:
        cfg["config_sections"] = {}
    elif not isinstance(sections, Mapping):
        raise ValueError(
            f"wandb_config['config_sections'] must be a dict, got {type(sections).__name__}: "
            f"{sections!r}."
        )
    mode = cfg.get("mode")
    if mode is not None and mode not in _WANDB_MODES:
        raise ValueError(f"wandb_config['mode'] must be one of {list(_WANDB_MODES)}, got {mode!r}.")
    if importlib.util.find_spec("wandb") is None:
        raise ImportError(
            "wandb_config is set but wandb is not installed; `pip install wandb` (or the "
            "project's [wandb] extra), or pass wandb_config=None to log locally only."
        )
    return cfg


def resolve_verbose(verbose: bool | None, sections: Mapping[str, Any]) -> bool | str:
    """True (a progress bar) or False (silence) as given, in the argument or the W&B
    ``config_sections``; otherwise a bar in a terminal and progress lines elsewhere (``LINES``:
    a notebook, a log file), so that a run never goes silent for minutes by default."""
    if verbose is not None:
        return bool(verbose)
    output = sections.get("output")
    if isinstance(output, Mapping) and output.get("verbose") is not None:
        return bool(output["verbose"])
    return True if sys.stdout.isatty() else LINES
