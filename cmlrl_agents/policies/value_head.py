"""State values for the actor-critic trainers: a scalar head over a causal LM's hidden state.

``V(s)`` is read at the last token of the state's text (for IAC the agent's prompt, for MAAC the
joint transcript): causal attention means that hidden state has seen the whole state and nothing
after it. The head sits either on a separate critic LM or on an actor's own trunk (shared).

Two ways in, both batched:

* :meth:`ValueModel.values` runs one right-padded forward of many states through the *trunk*
  (the base model under the LM head, e.g. ``LlamaForCausalLM.model``), so no vocabulary
  projection and no ``output_hidden_states``; only a model without a separate trunk is asked for
  its hidden states. Without ``grad=True`` it runs under ``no_grad``.
* :meth:`ValueModel.capture` (shared head) hooks the trunk during the actor's own scoring forward,
  so the values come from the very forward that scores the completions (no second pass).

The reference requested ``output_hidden_states=True`` on every forward, policy passes included
(research notes §2.7).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from cmlrl_agents.policies.model_methods import base_model, input_embeddings

__all__ = ["HeadCaptures", "ValueHead", "ValueModel", "find_trunk"]

HEAD_FILE = "value_head.pt"
HEAD_CONFIG_FILE = "value_head.json"


class ValueHead(nn.Module):
    """``hidden -> scalar``: a linear layer, or a tanh MLP when ``hidden_dim`` is given."""

    def __init__(self, hidden_size: int, hidden_dim: int | None = None) -> None:
        super().__init__()
        for name, value in (("hidden_size", hidden_size), ("hidden_dim", hidden_dim)):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise ValueError(f"{name} must be a positive int, got {value!r}.")
        self.hidden_size = hidden_size
        self.hidden_dim = hidden_dim
        # From the global generator: a trainer applies `args.seed` before it builds any model
        # or head, so a seeded run gets the same head every time.
        if hidden_dim is None:
            last = nn.Linear(hidden_size, 1)
            self.net: nn.Module = last
        else:
            first, last = nn.Linear(hidden_size, hidden_dim), nn.Linear(hidden_dim, 1)
            self.net = nn.Sequential(first, nn.Tanh(), last)
        nn.init.zeros_(last.bias)  # a state-independent offset has nothing to learn from at init

    def forward(self, hidden: Tensor) -> Tensor:
        """``[..., hidden_size] -> [...]`` (computed in the head's dtype, float32 by default)."""
        values: Tensor = self.net(hidden.to(self.net_dtype))
        return values.squeeze(-1)

    @property
    def net_dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype


def find_trunk(model: nn.Module) -> nn.Module | None:
    """The base model under a causal LM's head (``model.<base_model_prefix>``), or ``None``.

    PEFT wrappers are looked through (``get_base_model()``), so LoRA layers stay in the path.
    """
    base = base_model(model)
    prefix = getattr(base, "base_model_prefix", None)
    trunk = getattr(base, prefix, None) if isinstance(prefix, str) and prefix else None
    return trunk if isinstance(trunk, nn.Module) and trunk is not base else None


def _hidden_size(model: nn.Module) -> int:
    config = getattr(model, "config", None)
    for name in ("hidden_size", "n_embd", "d_model"):
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    dim = getattr(input_embeddings(model), "embedding_dim", None)
    if isinstance(dim, int):
        return dim
    raise ValueError(
        f"cannot tell the hidden size of {type(model).__name__} (no config.hidden_size and no "
        "input embeddings); pass hidden_size= to ValueModel."
    )


def _accepts(module: nn.Module, name: str) -> bool:
    try:
        params = inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def _last_hidden(output: Any) -> Tensor:
    """``[B, L, H]`` last-layer hidden states from a trunk or LM output (or a bare tensor)."""
    if isinstance(output, Tensor):
        return output
    hidden: Tensor | None = getattr(output, "last_hidden_state", None)
    if hidden is None and getattr(output, "hidden_states", None) is not None:
        hidden = output.hidden_states[-1]
    if hidden is None and isinstance(output, tuple) and output and isinstance(output[0], Tensor):
        hidden = output[0]
    if hidden is None:
        raise ValueError(
            f"the critic returned {type(output).__name__} without hidden states; use a model "
            "returning last_hidden_state or hidden_states (e.g. AutoModelForCausalLM/AutoModel)."
        )
    return hidden


def right_pad(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[Tensor, Tensor, Tensor]:
    """``(input_ids, attention_mask, last_positions)``; real tokens at ``0..len-1`` per row."""
    if not rows or any(len(r) == 0 for r in rows):
        raise ValueError("every state needs at least one token; got an empty batch or row.")
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for b, row in enumerate(rows):
        input_ids[b, : len(row)] = torch.as_tensor(list(row), dtype=torch.long)
        attention_mask[b, : len(row)] = 1
    return input_ids, attention_mask, torch.tensor([len(r) - 1 for r in rows])


class ValueModel(nn.Module):
    """``V(s) = head(hidden state of model at the state's last token)``.

    Args:
        model: a causal LM (``AutoModelForCausalLM``, PEFT-wrapped or not) or any model that
            returns hidden states (``AutoModel``).
        shared: the model is an actor's (value head on the actor): only the head is this
            module's own parameter set, and :meth:`save` writes only the head.
        head: an existing head (e.g. loaded); else a new one of ``head_hidden_dim``.
        hidden_size: needed only when the model's config does not say.
    """

    # Set with object.__setattr__ when not registered as submodules (see __init__).
    model: nn.Module
    trunk: nn.Module | None

    def __init__(
        self,
        model: nn.Module,
        *,
        shared: bool = False,
        head: ValueHead | None = None,
        head_hidden_dim: int | None = None,
        hidden_size: int | None = None,
    ) -> None:
        super().__init__()
        # A shared actor is not registered as a submodule: the critic's parameters, state_dict
        # and optimizer must hold the head only (the actor's optimizer owns the trunk).
        if shared:
            object.__setattr__(self, "model", model)
        else:
            self.model = model
        object.__setattr__(self, "trunk", find_trunk(model))
        self.shared = shared
        if shared and self.trunk is None:
            raise ValueError(
                f"a value head on the actor needs the actor's base model (model."
                f"base_model_prefix), which {type(model).__name__} does not expose; use a "
                "separate critic (use_separate_critic=True)."
            )
        size = hidden_size if hidden_size is not None else _hidden_size(model)
        self.head = head if head is not None else ValueHead(size, head_hidden_dim)
        self.head.to(self.device)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def own_parameters(self) -> list[nn.Parameter]:
        """The trainable parameters this critic owns: the head, plus the LM when not shared."""
        return [p for p in self.parameters() if p.requires_grad]

    def hidden_states(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        kwargs: dict[str, Any]
        module, kwargs = (
            (self.trunk, {})
            if self.trunk is not None
            else (self.model, {"output_hidden_states": True})
        )
        if _accepts(module, "use_cache"):
            kwargs["use_cache"] = False
        if self.trunk is None and _accepts(module, "logits_to_keep"):
            kwargs["logits_to_keep"] = 1  # only the hidden states are wanted, not the logits
        return _last_hidden(module(input_ids=input_ids, attention_mask=attention_mask, **kwargs))

    def forward(self, input_ids: Tensor, attention_mask: Tensor, positions: Tensor) -> Tensor:
        """``[B]`` values read at ``positions[b]`` of each row."""
        hidden = self.hidden_states(input_ids, attention_mask)
        values: Tensor = self.head(
            hidden[torch.arange(hidden.shape[0], device=hidden.device), positions.to(hidden.device)]
        )
        return values

    def values(
        self,
        rows: Sequence[Sequence[int]],
        pad_id: int,
        *,
        grad: bool = False,
        batch_size: int | None = None,
    ) -> Tensor:
        """``[B]`` float32 values of token rows (each a whole state), ``batch_size`` rows per
        forward (None: one forward). Under ``no_grad`` unless ``grad``."""
        size = batch_size or len(rows)
        pieces = []
        with torch.set_grad_enabled(grad and torch.is_grad_enabled()):
            for start in range(0, len(rows), size):
                ids, mask, pos = right_pad(rows[start : start + size], pad_id)
                pieces.append(self(ids.to(self.device), mask.to(self.device), pos))
        return torch.cat(pieces).float()

    @contextmanager
    def capture(self) -> Iterator[_Captured]:
        """Record the trunk's hidden states during the next forward of ``self.model``."""
        if self.trunk is None:
            raise ValueError("capture() needs a model with a separate trunk (see find_trunk).")
        captured = _Captured(self.head)

        def hook(_module: nn.Module, _inputs: Any, output: Any) -> None:
            captured.hidden = _last_hidden(output)

        handle = self.trunk.register_forward_hook(hook)
        try:
            yield captured
        finally:
            handle.remove()

    # -- saving ---------------------------------------------------------------------------------
    def save(self, folder: str | Path, tokenizer: Any = None) -> None:
        """``value_head.pt`` (+ its sizes in ``value_head.json``); a separate critic's LM and
        ``tokenizer`` as well, loadable with :meth:`from_pretrained`."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        if not self.shared:
            # A transformers/PEFT method, which nn.Module types as a Tensor | Module attribute.
            self.model.save_pretrained(folder)  # type: ignore[operator]
            if tokenizer is not None:
                tokenizer.save_pretrained(folder)
        torch.save(self.head.state_dict(), folder / HEAD_FILE)
        sizes = {"hidden_size": self.head.hidden_size, "hidden_dim": self.head.hidden_dim}
        (folder / HEAD_CONFIG_FILE).write_text(json.dumps(sizes) + "\n")

    @staticmethod
    def load_head(folder: str | Path) -> ValueHead:
        folder = Path(folder)
        sizes = json.loads((folder / HEAD_CONFIG_FILE).read_text())
        head = ValueHead(sizes["hidden_size"], sizes["hidden_dim"])
        head.load_state_dict(torch.load(folder / HEAD_FILE, weights_only=True))
        return head

    @classmethod
    def from_pretrained(cls, folder: str | Path, **model_kwargs: Any) -> ValueModel:
        """A separate critic saved by :meth:`save`."""
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(str(folder), **model_kwargs)
        return cls(model, head=cls.load_head(folder))


class _Captured:
    """Hidden states caught by :meth:`ValueModel.capture`; ``values(positions)`` reads them."""

    def __init__(self, head: ValueHead) -> None:
        self.head = head
        self.hidden: Tensor | None = None

    def values(self, positions: Tensor) -> Tensor:
        if self.hidden is None:
            raise RuntimeError("no forward ran inside ValueModel.capture(); nothing to read.")
        rows = torch.arange(self.hidden.shape[0], device=self.hidden.device)
        values: Tensor = self.head(self.hidden[rows, positions.to(self.hidden.device)])
        return values.float()


class HeadCaptures:
    """:meth:`ValueModel.capture` of several heads (None: no head) as one context: one forward
    of their shared trunk (a mixed-adapter pass) serves every head; ``captured[k]`` reads it."""

    def __init__(self, heads: Sequence[ValueModel | None]) -> None:
        self.heads = list(heads)
        self.captured: list[_Captured | None] = [None] * len(self.heads)
        self._stack = ExitStack()

    def __enter__(self) -> HeadCaptures:
        self.captured = [
            None if head is None else self._stack.enter_context(head.capture())
            for head in self.heads
        ]
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()
