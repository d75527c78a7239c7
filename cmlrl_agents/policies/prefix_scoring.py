"""Prefix-shared scoring: the G completions of one prompt scored with one forward of the prompt.

:func:`prefix_shared_logprobs` has :func:`cmlrl_agents.policies.logprobs.sequence_logprobs`'s
signature and result, so the learner swaps one for the other on a config switch
(``prefix_sharing``). It runs two forwards instead of one:

1. The batch's *distinct* prompts, left-padded so that every prompt ends in the last column, with
   explicit position ids (a row's first real token is position 0, as in the unshared pass) and
   a fresh ``DynamicCache``; only the last position's logits are computed: they score each
   prompt's first completion token.
2. The cache is gathered to one row per completion (``Cache.batch_select_indices``: an index,
   so gradients flow back to the one prompt forward and sum over its G completions), and the
   completions minus their last token are run on top of it: position ``t`` scores token
   ``t + 1``.

The prompt's keys and values are computed once per distinct prompt instead of once per
completion, with autograd through the cache; log-probs and gradients equal the unshared pass up
to float rounding (``tests/agents/test_prefix_scoring.py``). In a mixed-adapter batch
(``adapter_names``: adapter agents of one base scored together) a prompt is shared only by rows
of one adapter: the same text under another adapter has other keys and values.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from transformers import Cache, DynamicCache

from cmlrl_agents.policies.kv_cache import attention_cache, sampling_cache
from cmlrl_agents.policies.logprobs import (
    Temperature,
    TokenScores,
    _accepts_logits_to_keep,
    _check_vocab,
    _gather_logprobs,
    _last_positions,
    row_temperatures,
    sequence_scores,
)
from cmlrl_agents.policies.model_methods import base_model
from cmlrl_agents.policies.sampling import Truncation
from cmlrl_agents.policies.tokens import TokenBatch

__all__ = [
    "PromptGroups",
    "generate_inputs",
    "prefix_shared_logprobs",
    "prefix_shared_scores",
    "prompt_groups",
    "scorer",
    "shared_prompt_cache",
]

Scorer = Callable[..., TokenScores]


def scorer(prefix_sharing: bool) -> Scorer:
    """The learner's scoring function: prefix-shared or the plain padded forward (both take
    ``(model, batch, *, chunk=None, adapter_names=None, temperature=1.0, entropy=False)`` and
    return the same :class:`TokenScores`)."""
    return prefix_shared_scores if prefix_sharing else sequence_scores


class PromptGroups:
    """The rows of a :class:`TokenBatch` grouped by identical prompt (first-seen order).

    ``prompt_len[b]`` is where row ``b``'s completion starts, ``length[b]`` its real length,
    ``group[b]`` the index of its prompt in ``prompts``. With ``adapter_names`` (one per row) a
    group is one prompt under one adapter, and ``names[u]`` is prompt ``u``'s adapter.
    """

    def __init__(self, batch: TokenBatch, adapter_names: Sequence[str] | None = None) -> None:
        # One copy to the host: each read of a device tensor waits for the device.
        parts = (batch.input_ids, batch.attention_mask, batch.completion_mask)
        ids, attention, completion = torch.stack([t.long() for t in parts]).cpu()
        mask, lengths = completion.bool(), attention.sum(dim=1)
        self.length: list[int] = lengths.tolist()
        has = mask.any(dim=1)
        first = mask.float().argmax(dim=1)  # the first 1 of each row (0 when there is none)
        self.prompt_len: list[int] = torch.where(has, first, lengths).tolist()
        rows = ids.tolist()
        if adapter_names is not None and len(adapter_names) != len(rows):
            raise ValueError(
                f"adapter_names has {len(adapter_names)} names for a batch of {len(rows)} rows; "
                "pass one adapter name per row"
            )
        names = [None] * len(rows) if adapter_names is None else list(adapter_names)
        index: dict[tuple[str | None, tuple[int, ...]], int] = {}
        self.group: list[int] = []
        for row, n_p, name in zip(rows, self.prompt_len, names, strict=True):
            self.group.append(index.setdefault((name, tuple(row[:n_p])), len(index)))
        self.prompts: list[tuple[int, ...]] = [prompt for _, prompt in index]
        self.names: list[str | None] = [name for name, _ in index]

    @property
    def shares(self) -> bool:
        """Whether some prompt serves more than one row (else sharing saves nothing)."""
        return len(self.prompts) < len(self.group)


def prompt_groups(batch: TokenBatch, adapter_names: Sequence[str] | None = None) -> PromptGroups:
    """The batch's rows grouped by prompt (and adapter; see :class:`PromptGroups`)."""
    return PromptGroups(batch, adapter_names)


def _left_padded(
    rows: list[tuple[int, ...]], pad_id: int, device: torch.device
) -> tuple[Tensor, Tensor, Tensor]:
    """``(input_ids, attention_mask, position_ids)`` of left-padded rows; real tokens of each
    row sit at positions 0..n-1, as they do in the right-padded unshared batch."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(rows), width), dtype=torch.long)
    for u, row in enumerate(rows):
        ids[u, width - len(row) :] = torch.tensor(row, dtype=torch.long)
        attn[u, width - len(row) :] = 1
    positions = (attn.cumsum(dim=1) - 1).clamp(min=0)
    return ids.to(device), attn.to(device), positions.to(device)


def _cache_keyword(model: nn.Module) -> str:
    # transformers 5.24 renamed the forward's ``past_key_values`` to ``cache`` (the old name
    # warns); models written for older versions still take ``past_key_values``.
    base = base_model(model)
    names: Mapping[str, inspect.Parameter]
    try:
        names = inspect.signature(base.forward).parameters
    except (TypeError, ValueError):
        names = {}
    return "cache" if "cache" in names else "past_key_values"


def _names(names: Sequence[str | None]) -> list[str] | None:
    """peft's per-row ``adapter_names``, or None for a batch without them."""
    return None if any(n is None for n in names) else [str(n) for n in names]


def _forward(
    model: nn.Module, keep: int, adapter_names: list[str] | None, cache: Cache, **inputs: Tensor
) -> tuple[Tensor, Cache]:
    kwargs: dict[str, Any] = {"logits_to_keep": keep} if _accepts_logits_to_keep(model) else {}
    if adapter_names is not None:
        kwargs["adapter_names"] = adapter_names
    out = model(use_cache=True, **{_cache_keyword(model): cache}, **inputs, **kwargs)
    # ``.get`` of the old name warns on 5.24, so it is looked up only where "cache" is absent.
    returned = out["cache"] if "cache" in out else out.get("past_key_values")
    expected = inputs["attention_mask"].shape[1]
    if returned is None or returned.get_seq_length() != expected:
        # Gradient checkpointing turns the cache off in training (and hands back the empty
        # cache it was given): the continuations would then score without their prompt.
        raise ValueError(
            "prefix_sharing needs the model's KV cache, but the forward did not fill it "
            "(gradient checkpointing turns the cache off in training); set "
            "prefix_sharing=False in the config, or turn gradient checkpointing off"
        )
    return _last_positions(out.logits, keep), returned


def prefix_shared_logprobs(
    model: nn.Module,
    batch: TokenBatch,
    *,
    chunk: int | None = None,
    adapter_names: Sequence[str] | None = None,
    temperature: Temperature = 1.0,
) -> Tensor:
    """The ``logprobs`` of :func:`prefix_shared_scores`: :func:`sequence_logprobs`' result."""
    return prefix_shared_scores(
        model, batch, chunk=chunk, adapter_names=adapter_names, temperature=temperature
    ).logprobs


def prefix_shared_scores(
    model: nn.Module,
    batch: TokenBatch,
    *,
    chunk: int | None = None,
    adapter_names: Sequence[str] | None = None,
    temperature: Temperature = 1.0,
    entropy: bool = False,
    truncation: Truncation | None = None,
) -> TokenScores:
    """Per-token scores of ``batch`` like :func:`~cmlrl_agents.policies.logprobs.sequence_scores`
    (same arguments, same result), each distinct prompt (of each adapter, with
    ``adapter_names``) run once (see the module docstring). A batch without a repeated prompt
    takes the unshared path: there is nothing to share; so does a model whose cache holds more
    than attention keys and values (:func:`~cmlrl_agents.policies.kv_cache.attention_cache`).
    """
    groups = prompt_groups(batch, adapter_names)
    if not groups.shares or not attention_cache(model):
        return sequence_scores(
            model,
            batch,
            chunk=chunk,
            adapter_names=adapter_names,
            temperature=temperature,
            entropy=entropy,
            truncation=truncation,
        )
    if chunk is not None and chunk < 1:
        raise ValueError(f"chunk={chunk} must be a positive number of positions or None")
    if min(groups.prompt_len) < 1:
        raise ValueError(
            "completion_mask marks position 0, which has no preceding token to predict it; "
            "every row needs at least one prompt token (use build_batch)"
        )
    _check_vocab(model, batch.input_ids, batch.max_token)
    device = batch.input_ids.device
    temps = row_temperatures(temperature, len(groups.group), device)
    shared = _shared_scores(model, batch, groups, chunk, temps, entropy, truncation)
    # where(), not multiply: whatever sits off the mask must not leak in as NaN.
    mask = batch.completion_mask.bool()

    def masked(values: Tensor | None) -> Tensor | None:
        return None if values is None else torch.where(mask, values, torch.zeros_like(values))

    return TokenScores(
        logprobs=torch.where(mask, shared.logprobs, torch.zeros_like(shared.logprobs)),
        entropy=masked(shared.entropy),
        truncated_logprobs=masked(shared.truncated_logprobs),
    )


def _shared_scores(
    model: nn.Module,
    batch: TokenBatch,
    groups: PromptGroups,
    chunk: int | None,
    temps: Tensor | None,
    entropy: bool,
    truncation: Truncation | None,
) -> TokenScores:
    """``[B, L]`` log-probs (entropies, truncated log-probs) of the completions: the first
    token of each from its prompt's pass, the rest from one pass over the gathered prompt
    cache."""
    device = batch.input_ids.device
    ids, attn, positions = _left_padded(groups.prompts, 0, device)  # pads are masked: any id
    first_logits, cache = _forward(
        model,
        1,
        _names(groups.names),
        input_ids=ids,
        attention_mask=attn,
        position_ids=positions,
        cache=DynamicCache(),
    )
    group = torch.tensor(groups.group, device=device)
    out = torch.zeros(batch.input_ids.shape, dtype=torch.float32, device=device)
    wanted = {"logprobs": True, "entropy": entropy, "truncated_logprobs": truncation is not None}
    full = {name: out.clone() for name, on in wanted.items() if on}
    rows = torch.arange(len(groups.group), device=device)
    start = torch.tensor(groups.prompt_len, device=device)
    has = torch.tensor(
        [n > p for n, p in zip(groups.length, groups.prompt_len, strict=True)], device=device
    )
    first_target = batch.input_ids[rows, start.clamp(max=batch.input_ids.shape[1] - 1)]
    first = _gather_logprobs(
        first_logits[group], first_target.unsqueeze(1), chunk, temps, entropy, truncation
    )
    for name, values in full.items():
        values[rows[has], start[has]] = getattr(first, name)[:, 0][has]
    cont_len = max(n - p for n, p in zip(groups.length, groups.prompt_len, strict=True)) - 1
    if cont_len > 0:
        rest = _continuation_logprobs(
            model, batch, groups, cache, attn, group, cont_len, chunk, temps, entropy, truncation
        )
        cols = start.unsqueeze(1) + 1 + torch.arange(cont_len, device=device)
        valid = cols < torch.tensor(groups.length, device=device).unsqueeze(1)
        where = (rows.unsqueeze(1).expand_as(cols)[valid], cols[valid])
        for name, values in full.items():
            values[where] = getattr(rest, name)[valid]
    return TokenScores(
        logprobs=full["logprobs"],
        entropy=full.get("entropy"),
        truncated_logprobs=full.get("truncated_logprobs"),
    )


def _continuation_logprobs(
    model: nn.Module,
    batch: TokenBatch,
    groups: PromptGroups,
    cache: Cache,
    prompt_attn: Tensor,
    group: Tensor,
    cont_len: int,
    chunk: int | None,
    temps: Tensor | None,
    entropy: bool,
    truncation: Truncation | None,
) -> TokenScores:
    """``[B, cont_len]``: log-probs (and the rest) of completion tokens 1.. of each row, from
    one forward of tokens 0..cont_len-1 over the prompt cache gathered to one row per
    completion."""
    device = batch.input_ids.device
    b = len(groups.group)
    ids = torch.full((b, cont_len + 1), 0, dtype=torch.long, device=device)
    attn = torch.zeros((b, cont_len), dtype=torch.long, device=device)
    for r, (p, n) in enumerate(zip(groups.prompt_len, groups.length, strict=True)):
        ids[r, : n - p] = batch.input_ids[r, p:n]
        attn[r, : max(n - p - 1, 0)] = 1
    cache.batch_select_indices(group)
    names = _names([groups.names[u] for u in groups.group])
    positions = torch.tensor(groups.prompt_len, device=device).unsqueeze(1) + torch.arange(
        cont_len, device=device
    )
    logits, _ = _forward(
        model,
        cont_len,
        names,
        input_ids=ids[:, :cont_len],
        attention_mask=torch.cat([prompt_attn[group], attn], dim=1),
        position_ids=positions,
        cache=cache,
    )
    return _gather_logprobs(logits, ids[:, 1:], chunk, temps, entropy, truncation)


def shared_prompt_cache(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    adapter_names: Sequence[str] | None = None,
) -> dict[str, Cache]:
    """Generation's prompt pass shared by the G samples of a prompt: ``generate`` keywords.

    ``input_ids`` is the left-padded batch about to be given to ``generate`` (a prompt repeated
    once per sample). Each distinct row (under its adapter) runs once, all columns but the last,
    with the position ids ``generate`` gives them; its cache is gathered to one row per sample,
    so ``generate`` runs only the last prompt column and then samples as usual. Returns ``{}``
    (``generate`` runs the whole prompt) when no row repeats or the model takes no attention
    cache (:func:`~cmlrl_agents.policies.kv_cache.attention_cache`). Rows repeat when their ids
    and their masks do: a prompt that starts with the pad id pads like a shorter one.
    Call under ``torch.inference_mode()``.
    """
    names = [None] * len(input_ids) if adapter_names is None else list(adapter_names)
    index: dict[tuple[str | None, tuple[int, ...], tuple[int, ...]], int] = {}
    rows = zip(names, input_ids.tolist(), attention_mask.tolist(), strict=True)
    owner = [
        index.setdefault((name, tuple(row), tuple(mask)), len(index)) for name, row, mask in rows
    ]
    base = base_model(model)
    keyword = _cache_keyword(model)
    takes_cache = keyword in inspect.signature(base.forward).parameters
    shares = len(index) < len(owner) and input_ids.shape[1] >= 2
    if not shares or not takes_cache or not attention_cache(model):
        return {}
    first = torch.tensor([owner.index(u) for u in range(len(index))], device=input_ids.device)
    # generate's own positions (pads at 1), so the cached columns match an unshared prompt pass.
    positions = (attention_mask.cumsum(-1) - 1).masked_fill(attention_mask == 0, 1)
    kwargs: dict[str, Any] = {"logits_to_keep": 1} if _accepts_logits_to_keep(model) else {}
    if adapter_names is not None:
        kwargs["adapter_names"] = [names[int(i)] for i in first]
    cache = sampling_cache()  # generate appends every decoding step to it
    model(
        input_ids=input_ids[first, :-1],
        attention_mask=attention_mask[first, :-1],
        position_ids=positions[first, :-1],
        use_cache=True,
        **{keyword: cache},
        **kwargs,
    )
    if cache.get_seq_length() != input_ids.shape[1] - 1:
        return {}  # the model kept no cache: generate runs the whole prompt
    cache.batch_select_indices(torch.tensor(owner, device=input_ids.device))
    return {keyword: cache}


def generate_inputs(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    adapter_names: Sequence[str] | None = None,
) -> dict[str, Any]:
    """``generate``'s prompt keywords on the model's device: ``input_ids``, ``attention_mask``
    and, where a prompt repeats (its G samples), the cache of :func:`shared_prompt_cache`."""
    device = next(model.parameters()).device
    ids, mask = input_ids.to(device), attention_mask.to(device)
    return {
        "input_ids": ids,
        "attention_mask": mask,
        **shared_prompt_cache(model, ids, mask, adapter_names),
    }
