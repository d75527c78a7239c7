"""The models, tokenizer and task of ``gpu_check.py``, built offline with random weights.

Speed does not depend on the weights, so no checkpoint is loaded: ``smollm2`` is a Llama with
SmolLM2-135M's configuration (576 wide, 30 layers, 9 heads over 3 key/value heads, 49152 tokens,
tied embeddings) and ``tiny`` the test suite's 2-layer, 32-wide one. The tokenizer is the test
suite's byte-level one (SmolLM2's special tokens and chat template), grown for ``smollm2`` to
49152 tokens by byte-pair merges, so that every id the model samples decodes and the prompts are
about as long in tokens as SmolLM2's tokenizer makes them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

SMOLLM2_135M = {
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "vocab_size": 49152,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_theta": 100000.0,
    "tie_word_embeddings": True,
}
"""HuggingFaceTB/SmolLM2-135M's config.json (the fields that shape the work)."""

TINY = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": False,
}
"""``cmlrl_agents.tiny_models.tiny_model``'s shape; its vocabulary is the tokenizer's."""


@dataclass(frozen=True)
class Size:
    """One ``--size``: the model and the round (task items, samples, forced tokens)."""

    name: str
    model: dict[str, Any]
    items: int
    generations: int
    tokens: int
    timed_rounds: int


SIZES = {
    "tiny": Size("tiny", TINY, items=2, generations=2, tokens=4, timed_rounds=1),
    "smollm2": Size("smollm2", SMOLLM2_135M, items=8, generations=4, tokens=128, timed_rounds=2),
}

PROMPTS = (
    "Describe a city at night.",
    "Explain how a bicycle works.",
    "Write a recipe for bread.",
    "Summarise the water cycle.",
    "Give advice to a new gardener.",
    "Tell a story about a lighthouse.",
    "Compare trains and planes.",
    "Describe the taste of an orange.",
)


def tokenizer_for(vocab_size: int | None) -> Any:
    """The test suite's byte-level tokenizer, grown to ``vocab_size`` tokens by merges of byte
    pairs (None: as it is, 259 tokens)."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    from cmlrl_agents.tiny_models import tiny_tokenizer

    small = tiny_tokenizer()
    if vocab_size is None or vocab_size == len(small):
        return small
    spec = json.loads(small.backend_tokenizer.to_str())
    vocab: dict[str, int] = spec["model"]["vocab"]
    symbols = [token for token, index in sorted(vocab.items(), key=lambda kv: kv[1]) if index >= 3]
    merges = []
    for a in symbols:
        for b in symbols:
            if len(vocab) == vocab_size:
                break
            vocab[a + b] = len(vocab)
            merges.append([a, b])
    if len(vocab) != vocab_size:
        raise ValueError(f"vocab_size={vocab_size} is more than byte pairs can give")
    spec["model"]["merges"] = merges
    grown = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(spec)),
        bos_token=small.bos_token,
        eos_token=small.eos_token,
        pad_token=small.pad_token,
        unk_token=small.unk_token,
    )
    grown.chat_template = small.chat_template
    return grown


def build_model(size: Size, vocab_size: int, dtype: torch.dtype, device: str, seed: int) -> Any:
    """A randomly initialised ``LlamaForCausalLM`` of ``size`` in ``dtype``, built on ``device``
    (never materialised elsewhere first)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from cmlrl_agents.tiny_models import TINY_EOS_ID

    fields = {**size.model, "vocab_size": vocab_size}
    config = LlamaConfig(
        **fields, bos_token_id=1, eos_token_id=TINY_EOS_ID, pad_token_id=TINY_EOS_ID
    )
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(dtype)
    return model.eval()


def task(num_agents: int, items: int) -> dict[str, Any]:
    """The trainer's task keywords: ``items`` prompts, one formatter per agent, and a reward
    that differs between samples (the share of distinct characters, averaged over the team), so
    every group has advantages to learn from."""
    from datasets import Dataset

    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(items)]
    formatters = [_Formatter(i) for i in range(num_agents)]
    return {
        "train_dataset": Dataset.from_dict({"prompt": prompts}),
        "formatters": formatters,
        "reward_func": distinct_share,
    }


@dataclass(frozen=True)
class _Formatter:
    agent: int

    def __call__(self, item: dict[str, Any]) -> str:
        return f"You are agent {self.agent}. {item['prompt']}"


def distinct_share(*completions: Sequence[str]) -> list[float]:
    """Per joint response: the mean over agents of distinct characters / characters."""
    return [
        sum(len(set(text)) / (len(text) + 1) for text in joint) / len(joint)
        for joint in zip(*completions, strict=True)
    ]


def lora_config(*, random_init: bool = False) -> Any:
    """The benchmarks' adapter: r = 16 over q/k/v/o, no dropout (so adapter agents on one base
    train in one mixed-adapter pass). ``random_init``: B is random too, so adapters differ from
    the base and from each other from the start (the equality checks need that)."""
    from peft import LoraConfig

    return LoraConfig(
        r=16,
        lora_alpha=32,
        lora_dropout=0.0,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
        init_lora_weights=not random_init,
    )
