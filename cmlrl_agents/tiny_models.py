"""Tiny offline models: a byte-level tokenizer shaped like SmolLM2's and a random Llama (the
CLI's ``model: tiny``, the examples and the tests).

Everything is built in memory in well under a second, without the hub or any file. The tokenizer
reproduces the traps of the real one: ``pad == eos == <|im_end|>`` (id 2) and a chat template
that always contains ``<|im_end|>`` before the assistant turn (bug B1 of the reference).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from cmlrl_agents.policies.agent import LLMAgent

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

__all__ = [
    "TINY_CHAT_TEMPLATE",
    "TINY_EOS_ID",
    "tiny_agent",
    "tiny_model",
    "tiny_reward_model",
    "tiny_tokenizer",
]

TINY_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
TINY_EOS_ID = 2

# SmolLM2's template, shortened: a default system turn, so EOS is always inside the prompt.
TINY_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are tiny.<|im_end|>\\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@functools.lru_cache(maxsize=1)
def _tiny_backend_json() -> str:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    # Byte-level BPE with no merges: one token per byte, any text round-trips.
    vocab = {token: i for i, token in enumerate(TINY_SPECIAL_TOKENS)}
    for char in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[char] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in TINY_SPECIAL_TOKENS]
    )
    return backend.to_str()


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A fresh fast tokenizer (259 tokens: 3 specials + 256 bytes) with ``pad == eos``.

    The backend is built once and cached; each call returns a new wrapper, so a test that
    mutates its tokenizer cannot leak into another.
    """
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_tiny_backend_json()),
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
        unk_token="<|endoftext|>",
    )
    tokenizer.chat_template = TINY_CHAT_TEMPLATE
    return tokenizer


def tiny_model(
    vocab_size: int,
    seed: int = 0,
    *,
    hidden_size: int = 32,
    num_layers: int = 2,
    eos_token_id: int = TINY_EOS_ID,
    eos_bias: float = 0.0,
) -> nn.Module:
    """A randomly initialised ``LlamaForCausalLM`` (float32, eval mode), the same for a seed.

    A random model almost never samples EOS (p ~ 1/vocab); ``eos_bias`` adds that much to the EOS
    logit (via a forward hook on ``lm_head``, so generation and scoring both see it) for tests
    that need finished completions.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    if vocab_size < 1 or not 0 <= eos_token_id < vocab_size:
        raise ValueError(
            f"vocab_size={vocab_size}, eos_token_id={eos_token_id}: need 0 <= eos_token_id < "
            "vocab_size; pass len(tokenizer) as vocab_size"
        )
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        bos_token_id=1,
        eos_token_id=eos_token_id,
        pad_token_id=eos_token_id,
        tie_word_embeddings=False,
    )
    # fork_rng: a test's own torch.manual_seed stream is left untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    if eos_bias:

        def add_eos_bias(_module: nn.Module, _inputs: object, logits: Tensor) -> Tensor:
            bias = torch.zeros(logits.shape[-1], dtype=logits.dtype, device=logits.device)
            bias[eos_token_id] = eos_bias
            return logits + bias

        model.lm_head.register_forward_hook(add_eos_bias)
    return model.eval()


def tiny_agent(seed: int = 0, *, eos_bias: float = 0.0, **agent_kwargs: Any) -> LLMAgent:
    """An :class:`LLMAgent` over :func:`tiny_model` and :func:`tiny_tokenizer` (chat template
    on); ``agent_kwargs`` go to :class:`LLMAgent`."""
    tokenizer = tiny_tokenizer()
    return LLMAgent(tiny_model(len(tokenizer), seed, eos_bias=eos_bias), tokenizer, **agent_kwargs)


def tiny_reward_model(vocab_size: int, seed: int = 0, *, hidden_size: int = 32) -> nn.Module:
    """A randomly initialised ``LlamaForSequenceClassification`` with one output (a reward
    model), ``pad_token_id`` = :data:`TINY_EOS_ID` as in :func:`tiny_tokenizer`."""
    from transformers import LlamaConfig, LlamaForSequenceClassification

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        # A PreTrainedConfig keyword that LlamaConfig's annotated __init__ leaves out.
        num_labels=1,  # type: ignore[call-arg]
        pad_token_id=TINY_EOS_ID,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return LlamaForSequenceClassification(config).eval()
