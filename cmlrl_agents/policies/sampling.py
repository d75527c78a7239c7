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
of most likely tokens whose mass reaches ``top_p``), up to float rounding at the top-p boundary,
and but for ties at the top-k boundary: where the k-th largest logit equals the next, transformers
keeps every tied token (its top-k keeps each logit at least the k-th) and ``topk`` keeps k of
them. Exact ties are rare in float32 logits and common in bfloat16 ones (``hf_bf16``).
The tokens a seed gives differ from transformers' sampler, which draws other random numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from transformers import LogitsProcessor, LogitsProcessorList

__all__ = [
    "CandidateSampler",
    "SamplingConfig",
    "Truncation",
    "candidates",
    "keyed_uniforms",
    "row_key",
    "truncated_logprobs",
]


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


@dataclass(frozen=True)
class Truncation:
    """Each row's top-k and top-p, the truncation its sampler applied after the temperature:
    ``top_k`` ``[B]`` (0: none) and ``top_p`` ``[B]`` (1.0: none)."""

    top_k: Tensor
    top_p: Tensor

    @classmethod
    def of(cls, settings: list[tuple[int | None, float]], device: torch.device) -> Truncation:
        """From ``(top_k, top_p)`` per row."""
        return cls(
            torch.tensor([k or 0 for k, _ in settings], device=device),
            torch.tensor([p for _, p in settings], device=device, dtype=torch.float32),
        )


def truncated_logprobs(scaled: Tensor, targets: Tensor, truncation: Truncation) -> Tensor:
    """``[B, L]`` log-probs of ``targets`` under the distribution each row's sampler drew from:
    the softmax of ``scaled`` (logits already divided by the temperature, ``[B, L, V]``) cut to
    its top-k, then to the smallest set of most likely tokens whose mass reaches top-p (as
    :func:`candidates`), renormalised; ``-inf`` for a token outside that set. vLLM reports
    these for its draws (``logprobs_mode="processed_logprobs"``), so the trainer's own are what
    its truncated importance weights compare them with. No gradient."""
    with torch.no_grad():
        logp = scaled.float().log_softmax(dim=-1)
        vocab = logp.shape[-1]
        k = torch.where(truncation.top_k > 0, truncation.top_k, vocab).clamp(max=vocab)
        # Only the k most likely tokens can be kept: when every row has a top-k, topk finds
        # them (sorted) without sorting the vocabulary, 50x cheaper for SmolLM2's 49k tokens.
        ordered = logp.topk(int(k.max()), dim=-1).values
        rank = torch.arange(ordered.shape[-1], device=logp.device)
        in_k = rank.view(1, 1, -1) < k.view(-1, 1, 1)
        top = torch.where(in_k, ordered, -torch.inf)
        probs = torch.softmax(top, dim=-1)  # the top-k, renormalised
        keep = in_k & ((probs.cumsum(dim=-1) - probs) < truncation.top_p.view(-1, 1, 1))
        keep[..., 0] = True  # the most likely token always stays
        kept = torch.where(keep, ordered, -torch.inf)
        smallest = torch.where(keep, ordered, torch.inf).amin(dim=-1)
        target = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        inside = target - kept.logsumexp(dim=-1)
        return torch.where(target >= smallest, inside, -torch.inf)


_MASK64 = (1 << 64) - 1


def _mix(x: int) -> int:
    """splitmix64's finaliser on a Python int (64-bit)."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def row_key(*parts: int) -> int:
    """One 63-bit key from integers (a run's seed, an item's index, a turn, a sample, ...):
    the key of a generated row, whose draws then depend on nothing else."""
    key = 0
    for part in parts:
        key = _mix(key ^ (int(part) & _MASK64))
    return key >> 1  # fits a signed int64 tensor


def _shift(x: Tensor, bits: int) -> Tensor:
    """Logical right shift of int64 values (torch's ``>>`` keeps the sign)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def keyed_uniforms(keys: Tensor, step: int) -> Tensor:
    """``[B]`` float64 uniforms in [0, 1), one per row key for decoding step ``step``: a
    counter-based generator (splitmix64 of key and step), so a row's draws are the same in any
    batch, on any rank, whatever was drawn before."""
    x = keys.to(torch.int64) ^ _signed(_mix(step))
    x = x + _signed(0x9E3779B97F4A7C15)  # int64 arithmetic wraps, as splitmix64's does
    x = (x ^ _shift(x, 30)) * _signed(0xBF58476D1CE4E5B9)
    x = (x ^ _shift(x, 27)) * _signed(0x94D049BB133111EB)
    x = x ^ _shift(x, 31)
    return _shift(x, 11).to(torch.float64) / float(1 << 53)


class CandidateSampler(LogitsProcessor):
    """Samples each row's next token from :func:`candidates` and leaves only that token
    finite, so ``generate`` must run greedy (``do_sample=False``) after it.

    The draws come from torch's global generator (``torch.manual_seed`` repeats them), or with
    ``keys`` (one int64 per row, :func:`row_key`) from :func:`keyed_uniforms`: then a row's
    tokens depend on its key and the logits alone, not on the batch it is in or on other
    random draws (data parallel ranks and evaluation leave training's samples unchanged).

    With ``record`` (a list), each step appends the ``[B]`` log-probs of the picked tokens under
    the distribution they were drawn from (after temperature, top-k and top-p: what vLLM calls
    processed log-probs), so a sampler that is not the trainer's model can be corrected for."""

    def __init__(
        self,
        temperature: float,
        top_k: int | None,
        top_p: float,
        keys: Tensor | None = None,
        record: list[Tensor] | None = None,
    ) -> None:
        self.temperature, self.top_k, self.top_p = temperature, top_k, top_p
        self.keys = keys
        self.record = record
        self._step = 0

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        probs, ids = candidates(scores, self.temperature, self.top_k, self.top_p)
        if self.keys is None:
            picked = torch.multinomial(probs, num_samples=1)
        else:
            picked = self._inverse_cdf(probs)
        tokens = picked if ids is None else ids.gather(-1, picked)
        if self.record is not None:
            # top-p zeroed the tail: renormalise over what stayed, as the draw did.
            chosen = probs.gather(-1, picked).squeeze(-1) / probs.sum(dim=-1)
            self.record.append(chosen.float().log())
        out = torch.full_like(scores, float("-inf"))
        return out.scatter_(-1, tokens, 0.0)

    def _inverse_cdf(self, probs: Tensor) -> Tensor:
        """``[B, 1]`` index of each row's keyed draw from ``probs`` (unnormalised)."""
        assert self.keys is not None
        if self.keys.shape != probs.shape[:1]:
            raise ValueError(
                f"CandidateSampler has {self.keys.shape[0]} row keys for a batch of "
                f"{probs.shape[0]} rows; give one key per generated row"
            )
        u = keyed_uniforms(self.keys, self._step).to(probs.device)
        self._step += 1
        cdf = probs.double().cumsum(dim=-1)
        target = (u * cdf[:, -1]).unsqueeze(1)
        picked = torch.searchsorted(cdf, target, right=True)
        return picked.clamp(max=probs.shape[-1] - 1)

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


@dataclass(frozen=True)
class SamplingConfig:
    """How ``generate`` samples: these fields and nothing else (the checkpoint's own
    ``generation_config`` is not applied).

    The learners score log-probs at ``temperature`` (the tempered distribution the draws come
    from); ``top_k`` and ``top_p`` truncate the draws further, which the scored distribution
    does not include (as in TRL): below the truncation the two differ only in the tail that is
    never drawn. ``top_k=None`` disables top-k (``generate`` would otherwise default to 50).
    """

    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    do_sample: bool = True
    min_new_tokens: int = 0
    """EOS is suppressed before this many tokens (0: off); benchmarks force equal lengths."""

    def __post_init__(self) -> None:
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int):
            raise TypeError(f"max_new_tokens must be an int, got {self.max_new_tokens!r}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={self.max_new_tokens} must be >= 1")
        if not self.temperature > 0:
            raise ValueError(
                f"temperature={self.temperature} must be > 0; for greedy decoding pass "
                "do_sample=False"
            )
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p={self.top_p} must be in (0, 1]; 1.0 disables nucleus sampling")
        if self.top_k is not None and (isinstance(self.top_k, bool) or self.top_k < 1):
            raise ValueError(f"top_k={self.top_k!r} must be a positive int, or None to disable it")
        if not 0 <= self.min_new_tokens <= self.max_new_tokens:
            raise ValueError(
                f"min_new_tokens={self.min_new_tokens} must be in [0, max_new_tokens="
                f"{self.max_new_tokens}]"
            )

    def generate_kwargs(
        self, keys: Tensor | None = None, record: list[Tensor] | None = None
    ) -> dict[str, Any]:
        """Keyword arguments for ``model.generate``. :class:`LLMAgent` sets the checkpoint's own
        ``generation_config`` aside during the call, so these are the only sampling settings
        (no ``repetition_penalty``, ``suppress_tokens``, ... from the model's files).

        Sampling runs in :class:`~cmlrl_agents.policies.sampling.CandidateSampler` (transformers'
        distribution, drawn among the top-k candidates only), which leaves one token finite per
        row; ``generate`` then runs its greedy step, which takes that token. ``record``: see
        :class:`CandidateSampler` (greedy decoding records nothing)."""
        lengths: dict[str, Any] = {"max_new_tokens": self.max_new_tokens}
        if self.min_new_tokens:
            # Even min_new_tokens=0 makes transformers add a length processor, a no-op that
            # scans the vocabulary for EOS and copies the logits at every decoding step.
            lengths["min_new_tokens"] = self.min_new_tokens
        greedy = {**lengths, "do_sample": False, "num_beams": 1}
        if not self.do_sample:
            return greedy
        sampler = CandidateSampler(self.temperature, self.top_k, self.top_p, keys, record)
        return {**greedy, "logits_processor": LogitsProcessorList([sampler])}
