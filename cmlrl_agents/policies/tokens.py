"""Token bookkeeping between generation and scoring: pure functions on tensors.

Three rules, each the fix for a bug in the reference library (research notes, bugs B1-B3, B12):

* A completion is found by *position* (everything ``generate`` appended after the prompt width),
  never by searching for a pad token: pad may equal EOS, and chat templates contain EOS (B1).
* A completion ends at **and includes** its first EOS; every token after it is padding (B2).
* Every completion token is scored, the last one and the EOS included (B3, B12).

Masks are ``torch.long`` 0/1 tensors, like Hugging Face attention masks.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from cmlrl_agents.policies.model_methods import base_model, input_embeddings
from cmlrl_agents.policies.sampling import Truncation, truncated_logprobs

__all__ = [
    "Temperature",
    "TokenBatch",
    "TokenScores",
    "build_batch",
    "completion_lists",
    "completion_mask_from_generated",
    "left_pad",
    "row_temperatures",
    "sequence_logprobs",
    "sequence_scores",
]


def _eos_tensor(eos_ids: Iterable[int] | Tensor, device: torch.device) -> Tensor:
    ids = eos_ids if isinstance(eos_ids, Tensor) else torch.tensor(sorted(set(eos_ids)))
    ids = ids.reshape(-1).to(device=device, dtype=torch.long)
    if ids.numel() == 0:
        raise ValueError(
            "eos_ids is empty; pass the tokenizer's EOS id(s), e.g. agent.eos_token_ids, "
            "so that completions can end"
        )
    return ids


def completion_mask_from_generated(
    generated: Tensor, prompt_len: int, eos_ids: Iterable[int] | Tensor
) -> tuple[Tensor, Tensor]:
    """Split the output of ``generate`` on a left-padded batch into completions.

    Args:
        generated: ``[B, P + T]`` token ids: the (left-padded) prompt batch of width ``P`` followed
            by the ``T`` tokens ``generate`` appended.
        prompt_len: ``P``, the width of the padded prompt batch given to ``generate``.
        eos_ids: the ids that end a completion (a set, a list or a tensor).

    Returns:
        ``(ids, mask)``, both ``[B, T]``: ``ids`` are the new tokens and ``mask[b, t] = 1`` iff
        token ``t`` belongs to row ``b``'s completion, i.e. lies at or before its first EOS
        (all ``T`` tokens when no EOS was generated). The prompt part is never inspected.
    """
    if generated.dim() != 2:
        raise ValueError(
            f"generated must be a 2-D [batch, prompt_len + new_tokens] tensor, got shape "
            f"{tuple(generated.shape)}; pass the tensor returned by model.generate"
        )
    if not 0 <= prompt_len <= generated.shape[1]:
        raise ValueError(
            f"prompt_len={prompt_len} is outside [0, {generated.shape[1]}] (the width of "
            "generated); pass input_ids.shape[1] of the batch given to generate"
        )
    ids = generated[:, prompt_len:]
    is_eos = torch.isin(ids, _eos_tensor(eos_ids, ids.device)).long()
    # Tokens with no EOS strictly before them: the completion up to and including the first EOS.
    eos_before = is_eos.cumsum(dim=1) - is_eos
    return ids, (eos_before == 0).long()


def completion_lists(ids: Tensor, mask: Tensor) -> list[list[int]]:
    """The kept tokens of each row of ``ids`` (``mask`` is a prefix mask per row)."""
    lengths = mask.sum(dim=1).tolist()
    return [row[:n] for row, n in zip(ids.tolist(), lengths, strict=True)]


def left_pad(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    """Left-pad token rows into ``(input_ids, attention_mask)``, both ``[B, max_len]``.

    Decoder-only ``generate`` needs left padding so every row's next token follows its last real
    token.
    """
    if not rows:
        raise ValueError("rows is empty; pass at least one token list to pad")
    width = max(len(r) for r in rows)
    if width == 0:
        raise ValueError("every row is empty; a prompt needs at least one token")
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for b, row in enumerate(rows):
        if row:
            input_ids[b, width - len(row) :] = torch.as_tensor(list(row), dtype=torch.long)
            attention_mask[b, width - len(row) :] = 1
    return input_ids, attention_mask


@dataclass(frozen=True)
class TokenBatch:
    """Rows of prompt + completion, right-padded, ready for one scoring forward.

    ``completion_mask[b, t] = 1`` iff ``input_ids[b, t]`` is a completion token (a target to
    score); prompt and padding positions are 0.
    """

    input_ids: Tensor
    attention_mask: Tensor
    completion_mask: Tensor
    first_scored: int | None = None
    """The first column any row's completion starts at, and ``max_token`` the largest token
    id: known on the host when :func:`build_batch` made the batch, so scoring need not read
    the device for them (None: scoring reads them)."""
    max_token: int | None = None

    def __post_init__(self) -> None:
        shapes = {
            tuple(t.shape) for t in (self.input_ids, self.attention_mask, self.completion_mask)
        }
        if len(shapes) != 1 or self.input_ids.dim() != 2:
            raise ValueError(
                "TokenBatch tensors must share one [batch, length] shape, got input_ids "
                f"{tuple(self.input_ids.shape)}, attention_mask "
                f"{tuple(self.attention_mask.shape)}, completion_mask "
                f"{tuple(self.completion_mask.shape)}; build it with build_batch"
            )

    def select(self, rows: Sequence[int]) -> TokenBatch:
        """The batch of these rows (same length: their padding stays masked)."""
        index = torch.tensor(list(rows), device=self.input_ids.device)
        return TokenBatch(
            self.input_ids[index], self.attention_mask[index], self.completion_mask[index]
        )

    def to(self, device: torch.device | str) -> TokenBatch:
        return TokenBatch(
            self.input_ids.to(device),
            self.attention_mask.to(device),
            self.completion_mask.to(device),
            self.first_scored,
            self.max_token,
        )

    @property
    def completion_lengths(self) -> Tensor:
        """``[B]`` number of completion tokens per row."""
        return self.completion_mask.sum(dim=1)


def build_batch(
    prompt_ids: Sequence[Sequence[int]],
    completion_ids: Sequence[Sequence[int]],
    pad_id: int,
) -> TokenBatch:
    """Concatenate each prompt with its completion and right-pad the rows.

    Right padding keeps every row's real tokens at positions ``0..len-1``, the same positions
    left-padded generation gave them (``generate`` derives positions from the attention mask).
    """
    if len(prompt_ids) != len(completion_ids):
        raise ValueError(
            f"prompt_ids has {len(prompt_ids)} rows but completion_ids has {len(completion_ids)}; "
            "pass one prompt per completion (repeat a prompt for each of its samples)"
        )
    if not prompt_ids:
        raise ValueError("prompt_ids is empty; pass at least one (prompt, completion) pair")
    for b, prompt in enumerate(prompt_ids):
        if len(prompt) == 0:
            raise ValueError(
                f"prompt_ids[{b}] is empty; the first completion token needs at least one prompt "
                "token before it to be scored (e.g. BOS or the chat template)"
            )
    width = max(len(p) + len(c) for p, c in zip(prompt_ids, completion_ids, strict=True))
    input_ids = torch.full((len(prompt_ids), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    completion_mask = torch.zeros_like(input_ids)
    first, top = width, 0
    for b, (prompt, completion) in enumerate(zip(prompt_ids, completion_ids, strict=True)):
        n_p, n = len(prompt), len(prompt) + len(completion)
        input_ids[b, :n] = torch.as_tensor([*prompt, *completion], dtype=torch.long)
        attention_mask[b, :n] = 1
        completion_mask[b, n_p:n] = 1
        if completion:
            first = min(first, n_p)
        top = max(top, *prompt, *completion)
    return TokenBatch(input_ids, attention_mask, completion_mask, first, top)


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
        part = logits[:, start : start + step].float()
        if temperature is not None:
            part = part / temperature
        target = targets[:, start : start + step].unsqueeze(-1)
        lse = part.logsumexp(dim=-1)
        pieces.append(part.gather(-1, target).squeeze(-1) - lse)
        if entropy:
            with torch.no_grad():
                entropies.append(lse - (torch.softmax(part, dim=-1) * part).sum(dim=-1))
        if truncation is not None:
            truncated.append(truncated_logprobs(part, target.squeeze(-1), truncation))
    if not pieces:
        empty = logits.new_zeros(targets.shape, dtype=torch.float32)
        return TokenScores(
            logprobs=empty,
            entropy=empty.clone() if entropy else None,
            truncated_logprobs=empty.clone() if truncation is not None else None,
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
    logits: Tensor = out.logits[:, -keep:]
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
