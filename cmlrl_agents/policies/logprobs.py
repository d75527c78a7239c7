"""Scoring a :class:`~cmlrl_agents.policies.tokens.TokenBatch` under a model: each completion
token's log-prob at a temperature (every completion token, its EOS included), and when asked the
policy's entropy and the log-prob under the sampler's truncated distribution; one forward that
keeps only the completion's logits where the model allows it (``logits_to_keep``).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from cmlrl_agents.policies.model_methods import base_model, input_embeddings
from cmlrl_agents.policies.sampling import Truncation, truncated_logprobs
from cmlrl_agents.policies.tokens import TokenBatch

__all__ = [
    "Temperature",
    "TokenScores",
    "row_temperatures",
    "sequence_logprobs",
    "sequence_scores",
]


def _accepts_logits_to_keep(model: nn.Module) -> bool:
    # PEFT wrappers forward **kwargs to the base model, so look at the model that computes logits.
    base = base_model(model)
    try:
        return "logits_to_keep" in inspect.signature(base.forward).parameters
    except (TypeError, ValueError):
        return False


def _check_vocab(model: nn.Module, input_ids: Tensor, top: int | None = None) -> None:
    # The embedding lookup would fail with a bare "index out of range in self".
    embeddings = input_embeddings(model)
    vocab = getattr(embeddings, "num_embeddings", None)
    if vocab is None:
        return
    if top is None:  # a read of the device; build_batch knows it on the host
        top = int(input_ids.max()) if input_ids.numel() else 0
    if vocab is not None and top >= vocab:
        raise ValueError(
            f"token id {top} is outside the model's vocabulary of {vocab}; the tokenizer and the "
            "model do not match (resize the embeddings after adding tokens)"
        )


Temperature = float | Tensor
"""One sampling temperature for every row, or a ``[B]`` tensor of one per row (a mixed-adapter
batch of agents whose sampling settings differ)."""


@dataclass(frozen=True)
class TokenScores:
    """What one scoring pass gives per token: ``logprobs`` ``[B, L]`` (with gradient when the
    pass had one) and, when asked for, the policy's ``entropy`` ``[B, L]`` at each scored
    position (detached; 0 off the completion mask)."""

    logprobs: Tensor
    entropy: Tensor | None = None
    truncated_logprobs: Tensor | None = None
    """When the pass was given the rows' ``Truncation``: each token's log-prob under the
    truncated distribution its sampler drew from, by this model (detached; ``-inf`` for a token
    outside it; 0 off the mask)."""


def row_temperatures(temperature: Temperature, rows: int, device: torch.device) -> Tensor | None:
    """``temperature`` as a ``[rows, 1, 1]`` divisor of logits, or None when every row is at 1."""
    if isinstance(temperature, Tensor):
        if temperature.shape != (rows,):
            raise ValueError(
                f"temperature must be a float or a [{rows}] tensor (one per row), got shape "
                f"{tuple(temperature.shape)}"
            )
        if bool((temperature == 1).all()):
            return None
        return temperature.to(device=device, dtype=torch.float32).view(-1, 1, 1)
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if temperature == 1:
        return None
    return torch.full((rows, 1, 1), float(temperature), device=device)


class _TargetLogprob(torch.autograd.Function):
    """``log_softmax(logits / T)[..., target]`` as ``z[target] - logsumexp(z)``, ``z = logits /
    T``, with a backward that allocates one ``[B, L, V]`` buffer and works in it in place.

    Autograd's own chain (the division, ``logsumexp``, ``gather``) allocates one per step: the
    shift by the log-sum-exp, its exponential, the product with the gradient, the gather's
    zero-filled gradient, their sum and the division's gradient, each 141 MB for SmolLM2's
    vocabulary at 8 rows of 47 tokens. This computes the same numbers, bit for bit, in the same
    order: ``(z - lse).exp() * -g``, plus ``g`` at the target, divided by ``T``
    (``tests/agents/test_logprobs.py``). It saves ``z``, as autograd's chain did: the same
    memory."""

    @staticmethod
    def forward(
        ctx: Any, logits: Tensor, target: Tensor, temperature: Tensor | None, z: Tensor, lse: Tensor
    ) -> Tensor:
        # z and lse come computed (without gradient) so that the entropy can share them; logits
        # is the input the gradient is for.
        ctx.save_for_backward(z, target, lse, temperature)
        return z.gather(-1, target.unsqueeze(-1)).squeeze(-1) - lse

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None, None, None]:
        z, target, lse, temperature = ctx.saved_tensors
        out = (z - lse.unsqueeze(-1)).exp_().mul_(-grad.unsqueeze(-1))
        out.scatter_add_(-1, target.unsqueeze(-1), grad.unsqueeze(-1))
        return (out if temperature is None else out.div_(temperature)), None, None, None, None


def _gather_logprobs(
    logits: Tensor,
    targets: Tensor,
    chunk: int | None,
    temperature: Tensor | None = None,
    entropy: bool = False,
    truncation: Truncation | None = None,
) -> TokenScores:
    """``log_softmax(logits / T)[..., target]`` as ``target_logit - logsumexp``, ``chunk``
    positions at a time so the float32 copy of ``[B, chunk, V]`` is the largest temporary; with
    ``entropy`` also each position's entropy, with ``truncation`` each target's log-prob under
    the truncated sampling distribution (both without gradient)."""
    step = chunk or max(logits.shape[1], 1)
    pieces, entropies, truncated = [], [], []
    for start in range(0, logits.shape[1], step):
        raw = logits[:, start : start + step].float()
        target = targets[:, start : start + step]
        with torch.no_grad():
            part = raw if temperature is None else raw / temperature
            lse = part.logsumexp(dim=-1)
        pieces.append(_TargetLogprob.apply(raw, target, temperature, part, lse))
        with torch.no_grad():
            if entropy:
                entropies.append(lse - torch.softmax(part, dim=-1).mul_(part).sum(dim=-1))
            if truncation is not None:
                truncated.append(truncated_logprobs(part, target, truncation))
    if not pieces:
        # No position to score, but still the logits' graph: a loss over no completion token
        # backpropagates zeros, as autograd's own log_softmax and gather would.
        empty = logits.float().sum(dim=-1)
        return TokenScores(
            logprobs=empty,
            entropy=empty.detach().clone() if entropy else None,
            truncated_logprobs=empty.detach().clone() if truncation is not None else None,
        )
    return TokenScores(
        logprobs=torch.cat(pieces, dim=1),
        entropy=torch.cat(entropies, dim=1) if entropy else None,
        truncated_logprobs=torch.cat(truncated, dim=1) if truncation is not None else None,
    )


def sequence_scores(
    model: nn.Module,
    batch: TokenBatch,
    *,
    chunk: int | None = None,
    adapter_names: Sequence[str] | None = None,
    temperature: Temperature = 1.0,
    entropy: bool = False,
    truncation: Truncation | None = None,
) -> TokenScores:
    """Per-token log-probabilities (and entropies) of ``batch.input_ids`` under ``model`` at
    ``temperature``, from one forward.

    ``logprobs`` is a float32 ``[B, L]`` tensor aligned with ``input_ids``: entry ``[b, t]`` is
    ``log p_T(input_ids[b, t] | input_ids[b, :t])`` where ``completion_mask[b, t] = 1`` and 0
    elsewhere, ``p_T`` the softmax of the logits divided by the row's temperature: the
    distribution the sampler drew from before top-k/top-p truncation (TRL scores so too).
    Logits are only computed from the first position any row needs (the last prompt token of
    the shortest prompt), which skips the vocabulary projection of shared prompt prefixes.

    Args:
        model: a causal LM returning ``.logits`` (Hugging Face or PEFT).
        batch: from :func:`build_batch`, on the model's device.
        chunk: positions per log-softmax step; bounds the float32 ``[B, chunk, vocab]`` temporary.
        adapter_names: one peft adapter per row (a mixed-adapter batch of a shared base).
        temperature: the sampling temperature, one for all rows or a ``[B]`` tensor.
        entropy: also return each position's entropy (diagnostics).
        truncation: each row's top-k / top-p: also return ``truncated_logprobs``, the tokens'
            log-probs under the truncated distribution (what vLLM reports for its draws).
    """
    if chunk is not None and chunk < 1:
        raise ValueError(f"chunk={chunk} must be a positive number of positions or None")
    mask = batch.completion_mask
    length = mask.shape[1]
    first = batch.first_scored if batch.first_scored is not None else _first_scored(mask)
    if first == 0:
        raise ValueError(
            "completion_mask marks position 0, which has no preceding token to predict it; "
            "every row needs at least one prompt token (use build_batch)"
        )
    temps = row_temperatures(temperature, mask.shape[0], batch.input_ids.device)
    logits = _logits_from(model, batch, length - first + 1, adapter_names)
    targets = batch.input_ids[:, first:]
    scores = _gather_logprobs(logits[:, :-1], targets, chunk, temps, entropy, truncation)
    valid = mask.bool()

    def placed(values: Tensor | None) -> Tensor | None:
        return None if values is None else _placed(values, first, valid)

    return TokenScores(
        logprobs=_placed(scores.logprobs, first, valid),
        entropy=placed(scores.entropy),
        truncated_logprobs=placed(scores.truncated_logprobs),
    )


def _last_positions(logits: Tensor, keep: int) -> Tensor:
    """``logits[:, -keep:]``, or ``logits`` itself when it holds no more positions: autograd backs
    a ``[:, -keep:]`` slice with a zero-filled tensor of the whole input's size, into which the
    gradient is copied, even when the slice keeps every position (141 MB of logits for SmolLM2
    at 8 rows of 47 positions); an unsliced tensor passes its gradient on as it is."""
    return logits if logits.shape[1] <= keep else logits[:, -keep:]


def _logits_from(
    model: nn.Module, batch: TokenBatch, keep: int, adapter_names: Sequence[str] | None
) -> Tensor:
    """One forward's logits at the last ``keep`` positions (``first - 1 .. L - 1``: the last
    predicts nothing), computed only there when the model takes ``logits_to_keep``."""
    _check_vocab(model, batch.input_ids, batch.max_token)
    kwargs: dict[str, Any] = {"logits_to_keep": keep} if _accepts_logits_to_keep(model) else {}
    if adapter_names is not None:
        kwargs["adapter_names"] = list(adapter_names)
    out = model(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False, **kwargs
    )
    logits = _last_positions(out.logits, keep)
    if logits.shape[1] != keep:
        raise ValueError(
            f"the model returned logits for {out.logits.shape[1]} positions, expected at least "
            f"{keep}; pass a causal LM whose output has one logit row per input token"
        )
    return logits


def _first_scored(mask: Tensor) -> int:
    """The first column with a completion token (the mask's width when there is none)."""
    has_completion = mask.any(dim=0)
    return int(has_completion.nonzero()[0, 0]) if bool(has_completion.any()) else mask.shape[1]


def _placed(values: Tensor, first: int, valid: Tensor) -> Tensor:
    """``values`` of positions ``first..`` put back at their columns, 0 off ``valid``."""
    full = torch.cat([values.new_zeros(values.shape[0], first), values], dim=1)
    # where(), not multiply: non-finite logits at padding must not leak in as NaN.
    return torch.where(valid, full, torch.zeros_like(full))


def sequence_logprobs(
    model: nn.Module,
    batch: TokenBatch,
    *,
    chunk: int | None = None,
    adapter_names: Sequence[str] | None = None,
    temperature: Temperature = 1.0,
) -> Tensor:
    """The ``logprobs`` of :func:`sequence_scores`: float32 ``[B, L]``, 0 off the completion
    mask; ``.sum(-1)`` gives sequence log-probs. Works with and without autograd."""
    return sequence_scores(
        model, batch, chunk=chunk, adapter_names=adapter_names, temperature=temperature
    ).logprobs
