"""The run file's ``peft`` section: adapter agents (the trainers' ``peft_config``) from YAML.

.. code-block:: yaml

    peft:                        # one LoRA adapter per agent on one frozen base
      r: 8
      lora_alpha: 16
      lora_dropout: 0.0
      target_modules: [q_proj, v_proj]

Every key is a field of ``peft.LoraConfig``; a list of such mappings gives one config per agent
(in agent order). The section is checked, and the configs built, before any model loads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cmlrl_agents.cli.spec import CLIError, check_keys, one_line

if TYPE_CHECKING:
    from torch.nn.modules.module import _IncompatibleKeys

__all__ = ["describe_peft", "load_adapter_folders", "peft_section"]


def peft_section(section: Any, source: str, num_agents: int) -> Any:
    """``peft.LoraConfig`` from the ``peft`` section (a list of them for a list of mappings,
    one per agent); None without the section. ``source`` names the run file in errors."""
    if section is None:
        return None
    if isinstance(section, Mapping):
        return _lora(section, "peft", source)
    if not isinstance(section, list) or not section:
        raise CLIError(
            f"peft in {source} must be a mapping of LoraConfig fields (r, lora_alpha, "
            f"target_modules, ...) or a list of them, one per agent; got {section!r}."
        )
    if len(section) != num_agents:
        raise CLIError(
            f"peft in {source} lists {len(section)} adapter configs for {num_agents} agents; "
            "give one per agent, or one mapping for all."
        )
    return [_lora(entry, f"peft[{i}]", source) for i, entry in enumerate(section)]


def _lora(fields: Any, where: str, source: str) -> Any:
    from peft import LoraConfig

    if not isinstance(fields, Mapping):
        raise CLIError(
            f"{where} in {source} must be a mapping of LoraConfig fields, got {fields!r}."
        )
    valid = [f.name for f in dataclasses.fields(LoraConfig) if f.init]
    check_keys(fields, valid, f"{where} field (of LoraConfig) in {source}")
    _check_numbers(fields, where, source)
    try:
        return LoraConfig(**fields)
    except (TypeError, ValueError) as exc:
        raise CLIError(f"{where} in {source}: {one_line(exc)}") from None


def describe_peft(configs: Any) -> str:
    """The adapter configs in one line for ``cmlrl check``: each one's type and main fields."""
    each = configs if isinstance(configs, list) else [configs]
    lines = [
        f"{'every agent' if not isinstance(configs, list) else f'agent_{i}'}: "
        f"{type(c).__name__}(r={c.r}, lora_alpha={c.lora_alpha}, lora_dropout={c.lora_dropout}, "
        f"target_modules={_modules(c.target_modules)})"
        for i, c in enumerate(each)
    ]
    return "peft: adapter agents on one frozen base; " + "; ".join(lines)


def _modules(target: Any) -> Any:
    # peft keeps a list as a set (unordered) and a regex as the string it is.
    return sorted(target) if isinstance(target, (set, list, tuple)) else target


def _check_numbers(fields: Mapping[str, Any], where: str, source: str) -> None:
    """The fields peft only trips over once it builds the adapters."""
    r = fields.get("r", 8)
    if isinstance(r, bool) or not isinstance(r, int) or r < 1:
        raise CLIError(
            f"{where}.r in {source} must be a positive int (the adapter rank), got {r!r}."
        )
    alpha = fields.get("lora_alpha", 8)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or alpha <= 0:
        raise CLIError(f"{where}.lora_alpha in {source} must be a positive number, got {alpha!r}.")
    dropout = fields.get("lora_dropout", 0.0)
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
        raise CLIError(f"{where}.lora_dropout in {source} must be in [0, 1), got {dropout!r}.")


def load_adapter_folders(agents: Sequence[Any], folders: Sequence[Path]) -> None:
    """Load ``save_model``'s adapter folders (``agent_i/``, one per agent) into the adapters of
    freshly built adapter agents, agent i's folder into adapter ``agent_i``; every tensor of the
    adapter must be in the file and match its shape."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    for agent, folder in zip(agents, folders, strict=True):
        file = folder / "adapter_model.safetensors"
        if agent.adapter is None or not file.is_file():
            raise CLIError(
                f"{folder} holds no adapter of agent {agent.adapter or '(a full model)'}; give "
                "the run file's peft section the adapters were trained with."
            )
        # peft annotates its result as ``namedtuple``, which is no type: torch's is the real one.
        try:
            result: _IncompatibleKeys = set_peft_model_state_dict(
                agent.model, load_file(str(file)), agent.adapter
            )
        except RuntimeError as exc:  # tensors of other shapes: another rank, say
            first = str(exc).strip().splitlines()[-1].strip()
            raise CLIError(
                f"{file} does not fit adapter {agent.adapter} of the run file's peft section "
                f"({first}); give the peft section the adapters were trained with (their "
                f"{folder / 'adapter_config.json'})."
            ) from None
        missing = [k for k in result.missing_keys if f".{agent.adapter}." in k]
        if missing or result.unexpected_keys:
            raise CLIError(
                f"{file} does not fit adapter {agent.adapter} of the run file's peft section: "
                f"missing {missing[:3]}, unexpected {list(result.unexpected_keys)[:3]}."
            )
