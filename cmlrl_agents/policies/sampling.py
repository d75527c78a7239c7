"""Sampling the next token from the top-k candidates only: the distribution of transformers'
temperature, top-k and top-p warpers at a fraction of their cost.

transformers samples over the whole vocabulary at every step: top-p sorts all 49k logits of
each row, and ``multinomial`` draws one exponential per vocabulary entry. Those two were a fifth
of a SmolLM2 decoding step on one CPU thread (32 rows, top-k 50). :func:`candidates` keeps the
``top_k`` largest logits first (``topk`` returns them sorted, so top-p needs no sort), and
:class:`CandidateSampler` draws among them. It runs as a logits processor that leaves only its
pick finite, so ``generate``'s greedy step takes it and everything else about ``generate`` (the
cache, EOS, ``min_new_tokens``, peft's ``adapter_names``) is unchanged.

The distribution is transformers' (temperature, then top-k, then top-p keeping the smallest set
of most likely tokens whose mass reaches ``top_p``), up to float rounding at the top-p boundary.
The tokens a seed gives differ from transformers' sampler, which draws other random numbers.
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers import LogitsProcessor

__all__ = ["CandidateSampler", "candidates"]


def candidates(
    logits: Tensor, temperature: float, top_k: int | None, top_p: float
) -> tuple[Tensor, Tensor | None]:
    """``(probs, ids)``: each row's sampling distribution over its candidate tokens, most
    likely first, zero where top-p drops a token; ``ids`` is None when every token is a
    candidate (no top-k, no top-p), and ``probs`` then covers the vocabulary in order."""
    vocab = logits.shape[-1]
    scaled = logits / temperature
    if (top_k is None or top_k >= vocab) and top_p >= 1.0:
        return torch.softmax(scaled, dim=-1), None
    values, ids = scaled.topk(vocab if top_k is None else min(top_k, vocab), dim=-1)
    probs = torch.softmax(values, dim=-1)
    if top_p < 1.0:
        # A token stays while the tokens more likely than it hold less than top_p; the most
        # likely one always stays (transformers' min_tokens_to_keep=1).
        before = probs.cumsum(dim=-1) - probs
        keep = before < top_p
        keep[..., 0] = True
        probs = probs * keep
    return probs, ids


class CandidateSampler(LogitsProcessor):
    """Samples each row's next token from :func:`candidates` with torch's global generator
    (``torch.manual_seed`` repeats it) and leaves only that token finite, so ``generate`` must
    run greedy (``do_sample=False``) after it."""

    def __init__(self, temperature: float, top_k: int | None, top_p: float) -> None:
        self.temperature, self.top_k, self.top_p = temperature, top_k, top_p

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        probs, ids = candidates(scores, self.temperature, self.top_k, self.top_p)
        picked = torch.multinomial(probs, num_samples=1)
        tokens = picked if ids is None else ids.gather(-1, picked)
        out = torch.full_like(scores, float("-inf"))
        return out.scatter_(-1, tokens, 0.0)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CandidateSampler) and (
            (self.temperature, self.top_k, self.top_p)
            == (other.temperature, other.top_k, other.top_p)
        )

    def __hash__(self) -> int:
        return hash((self.temperature, self.top_k, self.top_p))

    def __repr__(self) -> str:
        return (
            f"CandidateSampler(temperature={self.temperature}, top_k={self.top_k}, "
            f"top_p={self.top_p})"
        )
