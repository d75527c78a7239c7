"""Token math: completion extraction, batch layout, and log-probs against naive references."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

from cmlrl_agents.policies.logprobs import sequence_logprobs
from cmlrl_agents.policies.tokens import (
    TokenBatch,
    build_batch,
    completion_lists,
    completion_mask_from_generated,
    left_pad,
)
from cmlrl_agents.testing import TINY_EOS_ID, tiny_model

EOS = TINY_EOS_ID  # also the pad id, as in SmolLM2
VOCAB = 40


# --------------------------------------------------------------------------- completion masks


def test_completion_mask_eos_middle_end_absent_with_pad_equal_eos_in_prompt() -> None:
    # Prompt width 4, left-padded with pad == eos == 2, and the prompt itself contains eos (2):
    # a search for the pad token would cut every row inside the prompt (reference bug B1).
    generated = torch.tensor(
        [
            [2, 2, 5, 2, 9, 2, 2, 2],  # eos in the middle, then padding (pad == eos)
            [5, 2, 6, 7, 9, 10, 11, 2],  # eos as the very last token
            [2, 5, 2, 6, 9, 10, 11, 12],  # no eos: all new tokens
            [5, 6, 7, 2, 2, 2, 2, 2],  # eos straight away
        ]
    )
    ids, mask = completion_mask_from_generated(generated, prompt_len=4, eos_ids={EOS})
    assert ids.tolist() == [[9, 2, 2, 2], [9, 10, 11, 2], [9, 10, 11, 12], [2, 2, 2, 2]]
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 1], [1, 0, 0, 0]]
    assert mask.dtype == torch.long
    assert completion_lists(ids, mask) == [[9, 2], [9, 10, 11, 2], [9, 10, 11, 12], [2]]


def test_completion_mask_several_eos_ids_and_tensor_input() -> None:
    generated = torch.tensor([[3, 3, 8, 4, 7, 0], [3, 3, 8, 0, 4, 0]])
    ids, mask = completion_mask_from_generated(generated, 2, torch.tensor([4, 7]))
    assert ids.tolist() == [[8, 4, 7, 0], [8, 0, 4, 0]]
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 0]]


def test_completion_mask_pad_different_from_eos() -> None:
    # generate pads finished rows with pad_token_id (here 0): the cut is at EOS, not at pad.
    generated = torch.tensor([[0, 5, 6, 2, 0, 0], [5, 5, 6, 0, 7, 2]])
    _, mask = completion_mask_from_generated(generated, 2, [2])
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]


def test_completion_mask_bad_input() -> None:
    with pytest.raises(ValueError, match="prompt_len=9"):
        completion_mask_from_generated(torch.zeros(2, 5, dtype=torch.long), 9, {2})
    with pytest.raises(ValueError, match="eos_ids is empty"):
        completion_mask_from_generated(torch.zeros(2, 5, dtype=torch.long), 2, set())
    with pytest.raises(ValueError, match="2-D"):
        completion_mask_from_generated(torch.zeros(5, dtype=torch.long), 2, {2})


# --------------------------------------------------------------------------- batch layout


def test_left_pad() -> None:
    input_ids, attention_mask = left_pad([[5, 6, 7], [8]], pad_id=2)
    assert input_ids.tolist() == [[5, 6, 7], [2, 2, 8]]
    assert attention_mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    with pytest.raises(ValueError, match="rows is empty"):
        left_pad([], 2)


def test_build_batch_exact_layout() -> None:
    batch = build_batch([[5, 2, 6], [7]], [[8, 2], [9, 10, 2]], pad_id=2)
    assert batch.input_ids.tolist() == [[5, 2, 6, 8, 2], [7, 9, 10, 2, 2]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    # Every completion token is a target, the final EOS included; the prompt's EOS is not.
    assert batch.completion_mask.tolist() == [[0, 0, 0, 1, 1], [0, 1, 1, 1, 0]]
    assert batch.completion_lengths.tolist() == [2, 3]


def test_build_batch_bad_input() -> None:
    with pytest.raises(ValueError, match="prompt_ids has 2 rows but completion_ids has 1"):
        build_batch([[1], [2]], [[3]], 0)
    with pytest.raises(ValueError, match=r"prompt_ids\[1\] is empty"):
        build_batch([[1], []], [[3], [4]], 0)
    with pytest.raises(ValueError, match="share one"):
        TokenBatch(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 4))


# --------------------------------------------------------------------------- log-probs

PROMPTS = [[1, 5, 2, 7], [1, 9], [1, 3, 4, 5, 6, 8, 2]]
COMPLETIONS = [[11, 12, EOS], [13, 14, 15, 16, 17, EOS], [18]]


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return tiny_model(VOCAB, seed=3)


def naive_logprobs(model: torch.nn.Module, prompt: list[int], completion: list[int]) -> list[float]:
    """One unpadded forward per sequence, one log_softmax per token: obviously right, slow."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0]
    return [
        torch.log_softmax(logits[len(prompt) + i - 1], dim=-1)[token].item()
        for i, token in enumerate(completion)
    ]


def test_batched_logprobs_equal_naive_reference(model: torch.nn.Module) -> None:
    batch = build_batch(PROMPTS, COMPLETIONS, pad_id=EOS)
    with torch.no_grad():
        lp = sequence_logprobs(model, batch)
    assert lp.shape == batch.input_ids.shape and lp.dtype == torch.float32
    for b, (prompt, completion) in enumerate(zip(PROMPTS, COMPLETIONS, strict=True)):
        start = len(prompt)
        expected = torch.tensor(naive_logprobs(model, prompt, completion))
        torch.testing.assert_close(lp[b, start : start + len(completion)], expected)
        # Every completion token is scored (EOS included); nothing else is.
        assert (lp[b, start : start + len(completion)] < 0).all()
        assert lp[b, :start].eq(0).all() and lp[b, start + len(completion) :].eq(0).all()


def test_batched_logprobs_equal_one_at_a_time(model: torch.nn.Module) -> None:
    with torch.no_grad():
        together = sequence_logprobs(model, build_batch(PROMPTS, COMPLETIONS, EOS)).sum(-1)
        alone = [
            sequence_logprobs(model, build_batch([p], [c], EOS)).sum()
            for p, c in zip(PROMPTS, COMPLETIONS, strict=True)
        ]
    torch.testing.assert_close(together, torch.stack(alone))


def test_last_token_eos_is_scored(model: torch.nn.Module) -> None:
    # Reference bug B3/B12: the final token (here EOS) was dropped from the sum.
    batch = build_batch([[1, 5]], [[6, EOS]], EOS)
    with torch.no_grad():
        lp = sequence_logprobs(model, batch)
    naive = naive_logprobs(model, [1, 5], [6, EOS])
    assert lp[0, 3].item() == pytest.approx(naive[1], abs=1e-5)
    assert lp[0].sum().item() == pytest.approx(sum(naive), abs=1e-5)


def test_padding_contributes_nothing(model: torch.nn.Module) -> None:
    batch = build_batch(PROMPTS, COMPLETIONS, pad_id=EOS)
    with torch.no_grad():
        clean = sequence_logprobs(model, batch)
    # Another pad id changes only padded input positions.
    other_pad = build_batch(PROMPTS, COMPLETIONS, pad_id=0)
    with torch.no_grad():
        torch.testing.assert_close(sequence_logprobs(model, other_pad), clean)

    # Poison the logits of every padded position with NaN: the result must not change.
    def poison(_module, _inputs, logits):
        pad = batch.attention_mask[:, -logits.shape[1] :] == 0
        return logits.masked_fill(pad.unsqueeze(-1), float("nan"))

    handle = model.lm_head.register_forward_hook(poison)
    try:
        with torch.no_grad():
            poisoned = sequence_logprobs(model, batch)
    finally:
        handle.remove()
    torch.testing.assert_close(poisoned, clean)


def test_logits_only_from_first_completion_position(model: torch.nn.Module) -> None:
    batch = build_batch(PROMPTS, COMPLETIONS, EOS)  # shortest prompt: 2 tokens
    seen: list[int] = []
    handle = model.lm_head.register_forward_hook(lambda m, i, out: seen.append(out.shape[1]))
    try:
        with torch.no_grad():
            sequence_logprobs(model, batch)
    finally:
        handle.remove()
    assert seen == [batch.input_ids.shape[1] - 2 + 1]


class FullLogitsOnly(torch.nn.Module):
    """A causal LM whose forward has no ``logits_to_keep`` (always returns every position)."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, input_ids, attention_mask=None, use_cache=False):
        return self.inner(input_ids=input_ids, attention_mask=attention_mask, use_cache=use_cache)


def test_models_without_logits_to_keep_and_chunking_agree(model: torch.nn.Module) -> None:
    batch = build_batch(PROMPTS, COMPLETIONS, EOS)
    with torch.no_grad():
        reference = sequence_logprobs(model, batch)
        torch.testing.assert_close(sequence_logprobs(FullLogitsOnly(model), batch), reference)
        torch.testing.assert_close(sequence_logprobs(model, batch, chunk=2), reference)
    with pytest.raises(ValueError, match="chunk=0"):
        sequence_logprobs(model, batch, chunk=0)


def test_gradients_flow_and_inference_mode_works(model: torch.nn.Module) -> None:
    batch = build_batch(PROMPTS, COMPLETIONS, EOS)
    lp = sequence_logprobs(model, batch)
    assert lp.requires_grad
    model.zero_grad()
    (-lp.sum()).backward()
    grad = model.lm_head.weight.grad
    assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0
    model.zero_grad()
    with torch.inference_mode():
        torch.testing.assert_close(sequence_logprobs(model, batch), lp.detach())


def test_empty_completion_row_scores_zero(model: torch.nn.Module) -> None:
    with torch.no_grad():
        lp = sequence_logprobs(model, build_batch([[1, 5], [1, 6, 7]], [[8, EOS], []], EOS))
    assert lp[1].eq(0).all() and (lp[0, 2:4] < 0).all()


def test_sequence_logprobs_bad_input(model: torch.nn.Module) -> None:
    ids = torch.tensor([[3, 4]])
    ones = torch.ones_like(ids)
    with pytest.raises(ValueError, match="position 0"):
        sequence_logprobs(model, TokenBatch(ids, ones, ones))
    with pytest.raises(ValueError, match=f"token id {VOCAB + 5} is outside"):
        sequence_logprobs(model, build_batch([[1]], [[VOCAB + 5]], EOS))
