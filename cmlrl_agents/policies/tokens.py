"""Token bookkeeping between generation and scoring: pure functions on tensors (the scoring
forward itself is ``logprobs.py``).

Three rules, each the fix for a bug in the reference library (research notes, bugs B1-B3, B12):

* A completion is found by *position* (everything ``generate`` appended after the prompt width),
  never by searching for a pad token: pad may equal EOS, and chat templates contain EOS (B1).
* A completion ends at **and includes** its first EOS; every token after it is padding (B2).
* Every completion token is scored, the last one and the EOS included (B3, B12).

Masks are ``torch.long`` 0/1 tensors, like Hugging Face attention masks.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = [
    "TokenBatch",
    "build_batch",
    "completion_lists",
    "completion_mask_from_generated",
    "left_pad",
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
