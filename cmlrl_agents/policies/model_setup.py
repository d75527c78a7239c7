"""What ``LLMAgent`` checks and adjusts on the model and tokenizer it is given.

- Precision: trainable weights are kept in float32 ("master weights"). AdamW on bfloat16 weights
  at a learning rate of 5e-6 leaves most of them unchanged, because an update smaller than half a
  bf16 ulp rounds away (measured: 7.5 % of the weights of a bf16 model moved in three steps, 100 %
  in float32). A model loaded in fp16/bf16 is therefore cast to float32 (with a PEFT adapter only
  the trainable adapter weights are; the frozen base keeps its dtype).
- Generation: ``generate`` sees our sampling settings only. A checkpoint's own
  ``generation_config`` (``repetition_penalty``, ``suppress_tokens``, ``no_repeat_ngram_size``,
  its own temperature, ...) is set aside for the call, so ``SamplingConfig`` is the whole story.
- Special ids: a completion ends at the tokenizer's EOS or any of ``generation_config``'s, and
  pads with the tokenizer's pad token, else its EOS.
- Vocabulary: a model whose embedding table is smaller than its tokenizer would fail with an
  ``IndexError`` in the middle of training; it is refused when the agent is built.
- Chat template: which template the agent applies (and any system turn it adds), and whether a
  prompt already carries the template (then it is used as it is, never wrapped twice).
- Dropout: the trainers turn it off (``disable_dropout``, as TRL does) so that every scoring
  pass of one weight state is one function: with LoRA dropout 0.1, a stale step's ratio to the
  "old" log-probs moved up to 0.16 away from 1 at learning rate 1e-9 (another dropout draw, not
  another policy), and tokens clipped with no policy change.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from cmlrl_agents.policies.model_methods import base_model, input_embeddings

__all__ = [
    "check_local_model_path",
    "active_dropout",
    "check_vocabulary",
    "disable_dropout",
    "eval_mode",
    "fp32_master_weights",
    "only_our_generation_settings",
    "ChatFormat",
]

logger = logging.getLogger("cmlrl_agents.policies.agent")

LOW_PRECISION = (torch.float16, torch.bfloat16)
_SENTINEL = "\x00CMLRL-PROMPT\x00"
_logged_formats: set[str] = set()
_warned_system_turn = False


def fp32_master_weights(model: nn.Module) -> torch.dtype | None:
    """Cast the trainable fp16/bf16 weights of ``model`` to float32 in place.

    A plain model is cast whole (``model.float()``), so every matmul sees one dtype; a PEFT model
    has only its trainable (adapter) weights cast, since PEFT casts the adapter's input itself.
    Returns the low-precision dtype that was replaced, or None when nothing needed a cast.
    """
    trainable = [p for p in model.parameters() if p.requires_grad]
    low = sorted({str(p.dtype) for p in trainable if p.dtype in LOW_PRECISION})
    if not low:
        return None
    if hasattr(model, "peft_config"):
        for p in trainable:
            if p.dtype in LOW_PRECISION:
                p.data = p.data.float()
    else:
        model.float()
    logger.info(
        "trainable weights were %s; they are kept in float32 (master weights) so that small "
        "AdamW updates are not rounded away",
        ", ".join(low),
    )
    return getattr(torch, low[0].removeprefix("torch."))


def check_vocabulary(model: nn.Module, tokenizer: Any) -> None:
    """Refuse a model whose embedding table cannot hold every id the tokenizer produces."""
    embeddings = input_embeddings(model)
    rows = getattr(embeddings, "num_embeddings", None)
    try:
        size = len(tokenizer)
    except TypeError:
        return
    if rows is not None and rows < size:
        raise ValueError(
            f"the model's vocabulary has {rows} embeddings but its tokenizer has {size} tokens, "
            f"so ids {rows}..{size - 1} would fail inside training; use the model's own "
            "tokenizer, or resize the embeddings first: model.resize_token_embeddings("
            "len(tokenizer))."
        )


def _token_id_set(value: Any) -> set[int]:
    if value is None:
        return set()
    if isinstance(value, int):
        return {value}
    return {int(v) for v in value}


def stop_and_pad_ids(model: nn.Module, tokenizer: Any) -> tuple[frozenset[int], int]:
    """The ids that end a completion (the tokenizer's EOS plus ``generation_config``'s) and the
    pad id: the tokenizer's, else its EOS, never a token added to the tokenizer (bug B19)."""
    tokenizer_eos = getattr(tokenizer, "eos_token_id", None)
    eos = _token_id_set(tokenizer_eos)
    generation_config = getattr(model, "generation_config", None)
    eos |= _token_id_set(getattr(generation_config, "eos_token_id", None))
    if not eos:
        raise ValueError(
            "neither the tokenizer nor model.generation_config has an EOS token id, so "
            "completions could never end; set tokenizer.eos_token"
        )
    pad = getattr(tokenizer, "pad_token_id", None)
    pad = pad if pad is not None else tokenizer_eos
    return frozenset(eos), int(pad) if pad is not None else min(eos)


def check_local_model_path(name_or_path: str | os.PathLike[str]) -> None:
    """A name that can only be a local folder (absolute, ``./``, ``~``, a folder inside an
    existing folder) must exist; otherwise the hub's "Repo id must be in the form ..." hides it."""
    text = os.fspath(name_or_path)
    path = Path(text).expanduser()
    if path.exists():
        return
    looks_local = (
        text.startswith(("/", "./", "../", "~", ".\\"))
        or "\\" in text
        or text.count("/") > 1
        or (path.parent != Path(".") and path.parent.is_dir())
    )
    if looks_local:
        raise FileNotFoundError(
            f"model folder {text!r} does not exist (resolved to {path.resolve()}); give the "
            "folder that holds config.json and the weights, or a hub id such as "
            "'HuggingFaceTB/SmolLM2-135M-Instruct'."
        )


def _dropout_rates(model: nn.Module) -> Iterator[tuple[nn.Module, str, float]]:
    """(module, attribute, rate) of every dropout the model applies in training mode: each
    ``nn.Dropout`` (peft's ``lora_dropout`` too) and each float attribute named ``*dropout``
    that transformers' modules pass to attention (``attention_dropout``)."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            yield module, "p", module.p
            continue
        for name, value in vars(module).items():
            if "dropout" in name and isinstance(value, float):
                yield module, name, value


def active_dropout(model: nn.Module) -> bool:
    """Whether the model draws dropout in training mode (a rate above 0 anywhere)."""
    return any(rate > 0 for _, _, rate in _dropout_rates(model))


def disable_dropout(model: nn.Module) -> None:
    """Set every dropout rate of the model to 0 (its config is left as it is): in training
    mode it then computes what it computes in eval mode, and gradient checkpointing, which
    transformers applies in training mode only, stays on."""
    for module, name, _ in list(_dropout_rates(model)):
        setattr(module, name, 0.0)


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """The model in eval mode within the block, each module's own mode restored afterwards
    (also on error; a model may hold modules in both): no dropout while sampling, and peft's
    mixed-adapter batches require it."""
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training


@contextmanager
def only_our_generation_settings(model: nn.Module) -> Iterator[None]:
    """Within the block, ``model.generate`` starts from transformers' defaults instead of the
    checkpoint's ``generation_config`` (restored afterwards, also on error)."""
    from transformers import GenerationConfig

    # PEFT's generate copies the wrapped model's generation_config onto itself, so the swap is
    # made on the innermost transformers model.
    target = base_model(model)
    original = getattr(target, "generation_config", None)
    if original is None:
        yield
        return
    # nn.Module.__setattr__ is annotated for tensors and modules; any value may be set.
    target.generation_config = GenerationConfig()  # type: ignore[assignment]
    try:
        yield
    finally:
        target.generation_config = original


class ChatFormat:
    """How an agent's tokenizer wraps a prompt: the rendered template around a sentinel."""

    def __init__(self, tokenizer: Any, system_prompt: str | None) -> None:
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt
        rendered = self.render(_SENTINEL)
        if _SENTINEL not in rendered:
            raise ValueError(
                "the tokenizer's chat template drops the user message; pass chat_template=False "
                "(model_config={'chat_template': False}) to tokenize prompts as plain text"
            )
        self.head, self.tail = rendered.split(_SENTINEL, 1)
        special = getattr(tokenizer, "all_special_tokens", None) or []
        # Markers that only a rendered template puts into a text: its special tokens and the
        # opening of the assistant turn.
        self.markers = sorted(t for t in special if t and t in rendered)
        self.opening = self.tail.strip()
        self.adds_system_turn = system_prompt is None and "system" in self.head.lower()

    def render(self, prompt: str) -> str:
        """``prompt`` as the user turn (after the system turn, if any), the assistant's opened."""
        messages = [{"role": "user", "content": prompt}]
        if self.system_prompt is not None:
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        text: str = self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
        return text

    def is_templated(self, prompt: str) -> bool:
        """True when ``prompt`` already went through a chat template (e.g. a comlrl formatter
        that called ``apply_chat_template``): it holds a template marker, or ends by opening the
        assistant turn."""
        if any(marker in prompt for marker in self.markers):
            return True
        return bool(self.opening) and prompt.rstrip().endswith(self.opening)

    def describe(self) -> str:
        example = f"{self.head}{{prompt}}{self.tail}"
        text = f"LLMAgent applies the tokenizer's chat template to every prompt: {example!r}."
        if self.adds_system_turn:
            text += " The template adds a system turn that no prompt asked for."
        return (
            text + " A prompt that already carries the template is used as it is. Turn it off "
            "with model_config={'chat_template': False} (or LLMAgent(..., chat_template=False)); "
            "replace the system turn with system_prompt=..."
        )

    def log_once(self) -> None:
        """Log :meth:`describe` at INFO once per distinct format and process; when the template
        adds a system turn (it changes what the model is told), also one short warning per
        process, not one per trainer, model or notebook cell."""
        global _warned_system_turn
        text = self.describe()
        if text not in _logged_formats:
            _logged_formats.add(text)
            logger.info(text)
        if self.adds_system_turn and not _warned_system_turn:
            _warned_system_turn = True
            logger.warning(
                f"The tokenizer's chat template adds a system turn to every prompt: "
                f"{self.head!r:.72}...; model_config={{'system_prompt': ...}} replaces it, "
                "{'chat_template': False} turns the template off."
            )
