"""Prefix-shared scoring equals the unshared pass: log-probs and gradients, on a tiny Llama."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import random

import pytest
import torch

from cmlrl_agents.algorithms.magrpo_config import MAGRPOConfig
from cmlrl_agents.algorithms.policy_gradient import PolicyGradientLearner
from cmlrl_agents.learning.batch import PolicyRow, TrainBatch
from cmlrl_agents.policies.agent import LLMAgent, SamplingConfig
from cmlrl_agents.policies.kv_cache import GrowingCache
from cmlrl_agents.policies.logprobs import sequence_logprobs
from cmlrl_agents.policies.prefix_scoring import (
    generate_inputs,
    prefix_shared_logprobs,
    prompt_groups,
)
from cmlrl_agents.policies.tokens import (
    build_batch,
    completion_lists,
    completion_mask_from_generated,
    left_pad,
)
from cmlrl_agents.testing import TINY_EOS_ID, tiny_agent, tiny_model

VOCAB = 40


def _rows(spec: list[tuple[int, list[int]]], seed: int = 0) -> tuple[list, list]:
    """``spec``: (prompt length, completion lengths of its G samples) per prompt."""
    rng = random.Random(seed)
    prompts, completions = [], []
    for prompt_len, lengths in spec:
        prompt = [rng.randrange(3, VOCAB) for _ in range(prompt_len)]
        for n in lengths:
            prompts.append(prompt)
            completions.append([rng.randrange(3, VOCAB) for _ in range(n)])
    return prompts, completions


def _scored(model, batch, score, weights):
    model.zero_grad(set_to_none=True)
    logprobs = score(model, batch)
    (logprobs.sum(dim=1) * weights).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    return logprobs.detach(), grads


# Several prompt lengths (1 token up), G = 1..4, completions of different lengths (1 token up,
# so the right-padded batch pads them), a prompt repeated further on in the batch.
SPECS = [
    [(3, [4, 1, 6, 2]), (7, [5, 5, 3]), (12, [1, 8, 2, 4]), (1, [3, 2])],
    [(5, [1, 1]), (2, [9, 4, 7, 1])],
    [(9, [2]), (4, [6, 3])],
]


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("spec", SPECS)
def test_shared_logprobs_and_gradients_equal_the_unshared_pass(spec, attention: str) -> None:
    model = tiny_model(VOCAB, seed=3)
    model.config._attn_implementation = attention
    model.train()
    prompts, completions = _rows(spec)
    batch = build_batch(prompts, completions, pad_id=TINY_EOS_ID)
    weights = torch.linspace(-1.0, 2.0, len(prompts))
    plain_lp, plain_grad = _scored(model, batch, sequence_logprobs, weights)
    shared_lp, shared_grad = _scored(model, batch, prefix_shared_logprobs, weights)
    assert torch.allclose(shared_lp, plain_lp, atol=1e-5, rtol=0)
    # Zero exactly off the completion tokens, as sequence_logprobs.
    assert bool((shared_lp[batch.completion_mask == 0] == 0).all())
    assert bool((shared_lp[batch.completion_mask == 1] < 0).all())
    for name, grad in plain_grad.items():
        assert torch.allclose(shared_grad[name], grad, atol=1e-5, rtol=1e-4), name


def test_groups_find_each_distinct_prompt_once_in_first_seen_order() -> None:
    prompts = [[5, 6], [5, 6], [7], [5, 6], [7, 8], [7]]
    completions = [[9], [9, 9], [9], [3], [4], [2, 2]]
    groups = prompt_groups(build_batch(prompts, completions, pad_id=TINY_EOS_ID))
    assert groups.prompts == [(5, 6), (7,), (7, 8)]
    assert groups.group == [0, 0, 1, 0, 2, 1]
    assert groups.prompt_len == [2, 2, 1, 2, 2, 1]
    assert groups.length == [3, 4, 2, 3, 3, 3]
    assert groups.shares


def test_distinct_prompts_take_the_unshared_path_bit_for_bit() -> None:
    model = tiny_model(VOCAB, seed=1)
    prompts, completions = _rows([(3, [2]), (5, [4]), (2, [1])])
    batch = build_batch(prompts, completions, pad_id=TINY_EOS_ID)
    assert not prompt_groups(batch).shares
    with torch.no_grad():
        assert torch.equal(prefix_shared_logprobs(model, batch), sequence_logprobs(model, batch))


def test_lora_model_gradients_equal_the_unshared_pass() -> None:
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(
        tiny_model(VOCAB, seed=2),
        peft.LoraConfig(
            r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False
        ),
    )
    model.train()
    prompts, completions = _rows(SPECS[0], seed=5)
    batch = build_batch(prompts, completions, pad_id=TINY_EOS_ID)
    weights = torch.linspace(1.0, -1.0, len(prompts))
    plain_lp, plain_grad = _scored(model, batch, sequence_logprobs, weights)
    shared_lp, shared_grad = _scored(model, batch, prefix_shared_logprobs, weights)
    assert torch.allclose(shared_lp, plain_lp, atol=1e-5, rtol=0)
    lora = [n for n in plain_grad if "lora_" in n]
    assert lora, "the LoRA parameters are trainable"
    for name in lora:
        assert torch.allclose(shared_grad[name], plain_grad[name], atol=1e-5, rtol=1e-4), name


def _two_adapter_model(peft):
    """Two different random LoRA adapters on one tiny base (a shared base of two agents)."""
    config = dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    torch.manual_seed(7)
    model = peft.get_peft_model(tiny_model(VOCAB, seed=2), peft.LoraConfig(**config), "agent_0")
    model.add_adapter("agent_1", peft.LoraConfig(**config))
    for name, param in model.named_parameters():
        param.requires_grad_("lora_" in name)  # both adapters train in a mixed pass
    return model.eval()  # peft refuses adapter_names in training mode


def test_mixed_adapter_batch_shares_prompts_per_adapter_with_equal_gradients() -> None:
    """The same prompt under two adapters is two groups (their keys and values differ); the
    shared pass equals the unshared mixed-adapter pass in log-probs and in both adapters'
    gradients."""
    peft = pytest.importorskip("peft")
    model = _two_adapter_model(peft)
    prompts, completions = _rows([(6, [3, 5, 2, 4]), (6, [4, 1, 3, 2]), (9, [2, 6])], seed=3)
    prompts[4:8] = prompts[:4]  # rows 4..7: agent_1 answers agent_0's prompt
    names = ["agent_0"] * 4 + ["agent_1"] * 4 + ["agent_0"] * 2
    batch = build_batch(prompts, completions, pad_id=TINY_EOS_ID)
    groups = prompt_groups(batch, names)
    assert groups.group == [0, 0, 0, 0, 1, 1, 1, 1, 2, 2]
    assert groups.names == ["agent_0", "agent_1", "agent_0"]
    assert groups.prompts[0] == groups.prompts[1]
    weights = torch.linspace(-1.0, 2.0, len(prompts))

    def plain(m, b):
        return sequence_logprobs(m, b, adapter_names=names)

    def shared(m, b):
        return prefix_shared_logprobs(m, b, adapter_names=names)

    plain_lp, plain_grad = _scored(model, batch, plain, weights)
    shared_lp, shared_grad = _scored(model, batch, shared, weights)
    # The adapters differ: one prompt's rows score differently under each.
    assert not torch.allclose(plain_lp[0], plain_lp[4])
    assert torch.allclose(shared_lp, plain_lp, atol=1e-5, rtol=0)
    for adapter in ("agent_0", "agent_1"):
        mine = [n for n in plain_grad if f".{adapter}." in n]
        assert mine and any(bool(plain_grad[n].abs().sum() > 0) for n in mine), adapter
        for name in mine:
            assert torch.allclose(shared_grad[name], plain_grad[name], atol=1e-5, rtol=1e-4), name


def test_adapter_names_must_name_every_row() -> None:
    prompts, completions = _rows([(3, [2, 2])])
    batch = build_batch(prompts, completions, pad_id=TINY_EOS_ID)
    with pytest.raises(ValueError, match="adapter_names has 1 names for a batch of 2 rows"):
        prompt_groups(batch, ["agent_0"])


def test_gradient_checkpointing_without_cache_is_refused_with_the_fix() -> None:
    model = tiny_model(VOCAB, seed=0)
    model.gradient_checkpointing_enable()
    model.train()
    prompts, completions = _rows([(3, [2, 2])])
    batch = build_batch(prompts, completions, pad_id=TINY_EOS_ID)
    with pytest.raises(ValueError, match="prefix_sharing=False"):
        prefix_shared_logprobs(model, batch)


def _learner_step(prefix_sharing: bool) -> dict[str, torch.Tensor]:
    agent = tiny_agent(seed=4)
    args = MAGRPOConfig(
        num_agents=1, prefix_sharing=prefix_sharing, forward_batch_size=None, output_dir=None
    )
    learner = PolicyGradientLearner([agent], args, num_turns=1)
    prompt = tuple(agent.encode_prompts(["Describe a city."])[0])
    rows = [
        PolicyRow(
            agent=0,
            item_slot=0,
            turn=1,
            prompt_ids=prompt,
            completion_ids=(40 + g, 50, 2)[: g + 1],
            advantage=float(g) - 1.5,
        )
        for g in range(4)
    ]
    learner.update(TrainBatch(tuple(rows), learner.windows(1)))
    return {n: p.detach().clone() for n, p in agent.model.named_parameters()}


def test_learner_step_is_the_same_with_and_without_prefix_sharing() -> None:
    shared, plain = _learner_step(True), _learner_step(False)
    assert any(not torch.equal(shared[n], tiny_agent(seed=4).model.state_dict()[n]) for n in shared)
    for name, value in plain.items():
        assert torch.allclose(shared[name], value, atol=1e-6), name


def test_prefix_sharing_is_validated_on_construction_and_assignment() -> None:
    assert MAGRPOConfig().prefix_sharing is True
    with pytest.raises((TypeError, ValueError), match="prefix_sharing"):
        MAGRPOConfig(prefix_sharing="yes")
    config = MAGRPOConfig()
    with pytest.raises((TypeError, ValueError), match="prefix_sharing"):
        config.prefix_sharing = 1


def _plain_generate(agent, rows, sampling, adapter_names=None):
    """The same rows through transformers' generate with no shared prompt pass."""
    ids, mask = left_pad(rows, agent.pad_token_id)
    extra = {} if adapter_names is None else {"adapter_names": adapter_names}
    with torch.inference_mode():
        out = agent.model.generate(
            input_ids=ids,
            attention_mask=mask,
            pad_token_id=agent.pad_token_id,
            eos_token_id=sorted(agent.eos_token_ids),
            **sampling.generate_kwargs(),
            **extra,
        )
    new, kept = completion_mask_from_generated(out, ids.shape[1], agent.eos_token_ids)
    return [tuple(r) for r in completion_lists(new, kept)]


PREFILL_ROWS = [[5, 6, 7, 8, 9]] * 3 + [[11, 12, 13, 14, 15, 16, 17, 18, 19]] * 3 + [[21, 22, 23]]


@pytest.mark.parametrize("do_sample", [False, True])
def test_generation_shares_the_prompt_pass_and_samples_the_same_tokens(do_sample) -> None:
    """A prompt repeated for its G samples runs its prompt pass once (a cache gathered to the G
    rows); the tokens equal transformers' generate over the repeated rows, greedy or sampled
    from the same seed."""
    agent = tiny_agent(seed=0)
    agent.model.eval()
    sampling = SamplingConfig(max_new_tokens=6, min_new_tokens=6, do_sample=do_sample)
    ids, mask = left_pad(PREFILL_ROWS, agent.pad_token_id)
    with torch.inference_mode():
        inputs = generate_inputs(agent.model, ids, mask)
    (cache,) = [v for k, v in inputs.items() if k not in ("input_ids", "attention_mask")]
    assert cache.get_seq_length() == ids.shape[1] - 1  # the prompt columns but the last
    assert isinstance(cache, GrowingCache)  # whose steps are written into room taken ahead
    torch.manual_seed(0)
    got = [c.completion_ids for c in agent.generate_rows(PREFILL_ROWS, sampling)]
    torch.manual_seed(0)
    assert got == _plain_generate(agent, PREFILL_ROWS, sampling)
    assert len({got[0], got[1], got[2]}) > 1 or not do_sample  # the G samples still differ


def test_mixed_adapter_generation_shares_prompts_per_adapter() -> None:
    peft = pytest.importorskip("peft")
    agent = tiny_agent(seed=0)
    config = dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    torch.manual_seed(7)
    model = peft.get_peft_model(agent.model, peft.LoraConfig(**config), "agent_0")
    model.add_adapter("agent_1", peft.LoraConfig(**config))
    shared = LLMAgent(model.eval(), agent.tokenizer, adapter="agent_0")
    rows = PREFILL_ROWS[:3] * 2 + PREFILL_ROWS[3:]  # one prompt under both adapters
    names = ["agent_0"] * 3 + ["agent_1"] * 3 + ["agent_0"] * 4
    sampling = SamplingConfig(max_new_tokens=6, min_new_tokens=6, do_sample=False)
    got = [c.completion_ids for c in shared.generate_rows(rows, sampling, adapter_names=names)]
    assert got[0] != got[3]  # the adapters answer the same prompt differently
    assert got == _plain_generate(shared, rows, sampling, names)


def test_a_prompt_that_pads_like_another_keeps_its_own_prompt_pass() -> None:
    # [pad, 50, 60, 70] and [50, 60, 70] left-pad to the same ids under different masks (a
    # prompt may start with the pad id where it is also EOS or BOS): they share nothing.
    agent = tiny_agent(seed=0, chat_template=False)
    with torch.no_grad():  # a random tiny model barely looks at its prompt: make it look
        for p in agent.model.parameters():
            if p.dim() == 2:
                p.mul_(8)
    rows = [[agent.pad_token_id, 50, 60, 70], [50, 60, 70]]
    ids, mask = left_pad(rows, agent.pad_token_id)
    assert torch.equal(ids[0], ids[1]) and not torch.equal(mask[0], mask[1])
    with torch.inference_mode():
        assert generate_inputs(agent.model, ids, mask).keys() == {"input_ids", "attention_mask"}
    sampling = SamplingConfig(max_new_tokens=8, do_sample=False)
    got = [c.completion_ids for c in agent.generate_rows(rows, sampling)]
    assert got == _plain_generate(agent, rows, sampling)
    assert got[1] == _plain_generate(agent, rows[1:], sampling)[0]


def _hybrid_models():
    """Tiny models whose cache holds more than attention keys and values."""
    import transformers

    from cmlrl_agents.testing import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    common = dict(vocab_size=len(tokenizer), pad_token_id=2, eos_token_id=2, bos_token_id=1)
    lfm2 = transformers.Lfm2Config(
        **common, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, layer_types=["conv", "full_attention"],
    )  # fmt: skip
    mamba = transformers.MambaConfig(**common, hidden_size=32, num_hidden_layers=2, state_size=4)
    torch.manual_seed(0)
    return tokenizer, {
        "lfm2": transformers.Lfm2ForCausalLM(lfm2).eval(),
        "mamba": transformers.MambaForCausalLM(mamba).eval(),
    }


def test_models_with_other_cache_states_share_no_prompt_and_match_the_unshared_paths() -> None:
    # LFM2's convolution states and Mamba's recurrent states are not attention keys and values:
    # the shared prompt pass would hand generate a cache without them (it raised IndexError).
    from cmlrl_agents.policies.kv_cache import attention_cache

    tokenizer, models = _hybrid_models()
    assert attention_cache(tiny_agent(seed=0).model)
    for name, model in models.items():
        assert not attention_cache(model), name
        agent = LLMAgent(model, tokenizer, chat_template=False)
        sampling = SamplingConfig(max_new_tokens=4, do_sample=False)
        got = [c.completion_ids for c in agent.generate_rows(PREFILL_ROWS, sampling)]
        assert got == _plain_generate(agent, PREFILL_ROWS, sampling), name
        completions = [[11, 12], [13], [14, 15, 16], [17], [18, 19], [20], [21]]
        batch = build_batch(PREFILL_ROWS, completions, agent.pad_token_id)
        shared = agent.score(batch, prefix_sharing=True)
        assert torch.equal(shared, agent.score(batch, prefix_sharing=False)), name
