"""The LLM policy: prompts in, completions out (one batched ``generate``), log-probs back.

The agent never mutates the tokenizer it is given (users often share one tokenizer between
agents): it pads token ids itself (left for generation, right for scoring), so the tokenizer's
``padding_side`` is irrelevant, and when the tokenizer has no pad token it pads with EOS instead of
adding a token (adding one without resizing the embeddings is bug B19). Padding is masked out
everywhere, so the pad id only has to be a valid id.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from cmlrl_agents.policies.adapter_spans import adapter_span_forwards
from cmlrl_agents.policies.decode_layout import decode_layout

# Re-exported: model-file conversion lives in gguf.py, the names stay importable from here.
from cmlrl_agents.policies.gguf import SMOLLM2_GGUF, convert_gguf, default_cache_dir, smollm2_path
from cmlrl_agents.policies.logprobs import Temperature, TokenScores
from cmlrl_agents.policies.model_setup import (
    ChatFormat,
    check_local_model_path,
    check_vocabulary,
    eval_mode,
    fp32_master_weights,
    only_our_generation_settings,
    stop_and_pad_ids,
)
from cmlrl_agents.policies.prefix_scoring import generate_inputs, scorer
from cmlrl_agents.policies.sampling import SamplingConfig, Truncation
from cmlrl_agents.policies.tokens import (
    TokenBatch,
    build_batch,
    completion_lists,
    completion_mask_from_generated,
    left_pad,
)
from cmlrl_agents.policies.weight_gradients import gathered_weight_gradients

__all__ = [
    "Completion",
    "LLMAgent",
    "SMOLLM2_GGUF",
    "SamplingConfig",
    "convert_gguf",
    "default_cache_dir",
    "smollm2_path",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Completion:
    """One sampled completion of one prompt.

    ``completion_ids`` ends at and includes the first EOS when one was generated (``finished``);
    ``text`` is the completion decoded without special tokens.
    """

    text: str
    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    finished: bool
    sampler_logprobs: tuple[float, ...] | None = None
    """The sampler's log-prob of each completion token, when the backend reports them (vLLM,
    or transformers' ``generate`` on a bfloat16 copy); None when the sampler is the trainer's
    own model."""


class LLMAgent:
    """A causal LM and its tokenizer as a policy over text.

    Args:
        model: a Hugging Face causal LM (or a PEFT wrapper of one).
        tokenizer: its tokenizer; never modified.
        chat_template: ``None`` uses the tokenizer's chat template when it has one (instruct
            models such as SmolLM2 answer with an immediate EOS without it); ``True`` requires it;
            ``False`` tokenizes prompts as plain text.
        system_prompt: a system turn put before each prompt (needs the chat template).
        device: where to move the model; ``None`` keeps it where it is.
        adapter: this agent's LoRA adapter on ``model``, a ``PeftModel`` shared with other
            agents (see :mod:`cmlrl_agents.policies.adapters`); only its parameters train.

    The template and any system turn it adds are logged once (this module's logger).
    A prompt that already carries the template (a formatter that called
    ``apply_chat_template``) is tokenized as it is, never wrapped a second time. Trainable
    fp16/bf16 weights are cast to float32 (see :mod:`cmlrl_agents.policies.model_setup`).
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any,
        *,
        chat_template: bool | None = None,
        system_prompt: str | None = None,
        device: torch.device | str | None = None,
        adapter: str | None = None,
    ) -> None:
        if adapter is not None and adapter not in (getattr(model, "peft_config", None) or {}):
            raise ValueError(
                f"adapter={adapter!r} is not an adapter of the given model "
                f"({type(model).__name__}); add it first (model.add_adapter({adapter!r}, config)) "
                "or build adapter agents with the trainer's peft_config=..."
            )
        self.adapter = adapter
        has_template = bool(getattr(tokenizer, "chat_template", None))
        if chat_template and not has_template:
            raise ValueError(
                "chat_template=True but the tokenizer has no chat template; pass "
                "chat_template=None (auto) or False, or set tokenizer.chat_template"
            )
        self.use_chat_template = has_template if chat_template is None else bool(chat_template)
        if system_prompt is not None and not self.use_chat_template:
            raise ValueError(
                f"system_prompt={system_prompt[:40]!r} needs a chat template, and this agent "
                "tokenizes plain text; use a tokenizer with a chat template or put the text in "
                "the prompts"
            )
        check_vocabulary(model, tokenizer)
        self.model = model if device is None else model.to(device)
        self.loaded_dtype = fp32_master_weights(self.model)
        """The fp16/bf16 dtype the trainable weights were cast to float32 from (None: none)."""
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt
        self.chat_format = ChatFormat(tokenizer, system_prompt) if self.use_chat_template else None
        if self.chat_format is not None:
            self.chat_format.log_once()
        self._eos_token_ids, self.pad_token_id = stop_and_pad_ids(model, tokenizer)
        self.reports_sampler_logprobs = False
        """Give each sampled completion its tokens' log-probs under the distribution they were
        drawn from (``Completion.sampler_logprobs``): set by a backend that samples from a copy
        of this agent's weights (``generation_backend="hf_bf16"``), whose draws the trainer
        then corrects for."""

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """Ids that end a completion: the tokenizer's EOS plus ``generation_config`` EOS ids."""
        return self._eos_token_ids

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def activate(self) -> None:
        """Make this agent's adapter the active one on its shared base (no-op without one)."""
        if self.adapter is not None and self.model.active_adapter != self.adapter:
            # A transformers/PEFT method, which nn.Module types as a Tensor | Module attribute.
            self.model.set_adapter(self.adapter)  # type: ignore[operator]

    def trainable_parameters(self) -> list[nn.Parameter]:
        """What this agent's optimizer steps: its adapter, or its model's trainable weights."""
        if self.adapter is None:
            return [p for p in self.model.parameters() if p.requires_grad]
        return [p for n, p in self.model.named_parameters() if f".{self.adapter}." in n]

    def encode_prompts(self, prompts: Sequence[str]) -> list[list[int]]:
        """Token ids of each prompt: chat-templated with the assistant turn opened, or plain
        tokenization (with the tokenizer's BOS if it adds one) when the agent has no template."""
        if isinstance(prompts, str) or not all(isinstance(p, str) for p in prompts):
            raise TypeError(
                f"prompts must be a list of strings, got {type(prompts).__name__} "
                f"{str(prompts)[:60]!r}; wrap a single prompt: [prompt]"
            )
        if not prompts:
            raise ValueError("prompts is empty; pass at least one prompt")
        if self.chat_format is not None:
            fmt = self.chat_format
            texts = [p if fmt.is_templated(p) else fmt.render(p) for p in prompts]
            # The template already holds any BOS/EOS it wants; do not add them twice.
            ids = self.tokenizer(texts, add_special_tokens=False)["input_ids"]
        else:
            ids = self.tokenizer(list(prompts), add_special_tokens=True)["input_ids"]
        for i, row in enumerate(ids):
            if not row:
                raise ValueError(
                    f"prompts[{i}]={prompts[i]!r} encodes to no tokens and the tokenizer adds no "
                    "BOS; a completion needs at least one prompt token to condition on"
                )
        return [list(row) for row in ids]

    def generate(
        self,
        prompts: Sequence[str],
        num_samples: int = 1,
        sampling: SamplingConfig | None = None,
        keys: Sequence[int] | None = None,
    ) -> list[list[Completion]]:
        """``num_samples`` completions per prompt from ONE batched ``generate`` call; ``keys``
        (one per prompt and sample, prompt-major: ``sampling.row_key``) make each row's draws
        depend on its key alone, else torch's global generator draws.

        Returns ``completions[prompt][sample]``.
        """
        return self.generate_ids(self.encode_prompts(prompts), num_samples, sampling, keys)

    def generate_ids(
        self,
        prompt_ids: Sequence[Sequence[int]],
        num_samples: int = 1,
        sampling: SamplingConfig | None = None,
        keys: Sequence[int] | None = None,
    ) -> list[list[Completion]]:
        """:meth:`generate` for prompts that are already token ids."""
        if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
            raise ValueError(f"num_samples={num_samples!r} must be a positive int")
        if not prompt_ids:
            raise ValueError("prompts is empty; pass at least one prompt")
        rows = [list(ids) for ids in prompt_ids for _ in range(num_samples)]
        flat = self.generate_rows(rows, sampling, keys=keys)
        return [flat[i : i + num_samples] for i in range(0, len(flat), num_samples)]

    def generate_rows(
        self,
        rows: Sequence[Sequence[int]],
        sampling: SamplingConfig | None = None,
        adapter_names: Sequence[str] | None = None,
        keys: Sequence[int] | None = None,
    ) -> list[Completion]:
        """One completion per row of prompt ids from ONE ``generate`` call; ``adapter_names``
        (one per row, peft's mixed-adapter batch) or None (this agent's adapter, if any);
        ``keys`` one per row (see :meth:`generate`)."""
        sampling = sampling if sampling is not None else SamplingConfig()
        rows = [list(ids) for ids in rows]
        if keys is not None and len(keys) != len(rows):
            raise ValueError(f"{len(keys)} sampling keys for {len(rows)} rows; give one per row")
        row_keys = None if keys is None else torch.tensor(list(keys), dtype=torch.int64)
        input_ids, attention_mask = left_pad(rows, self.pad_token_id)
        record: list[Tensor] | None = [] if self.reports_sampler_logprobs else None
        new_ids, mask = self._generate_tokens(
            input_ids, attention_mask, sampling, adapter_names, row_keys, record
        )
        kept = completion_lists(new_ids, mask)
        texts = self.tokenizer.batch_decode(kept, skip_special_tokens=True)
        eos = self.eos_token_ids
        steps = torch.stack(record, dim=1).tolist() if record else None  # [rows][step]
        return [
            Completion(
                text,
                tuple(prompt),
                tuple(ids),
                bool(ids) and ids[-1] in eos,
                None if steps is None else tuple(steps[i][: len(ids)]),
            )
            for i, (prompt, ids, text) in enumerate(zip(rows, kept, texts, strict=True))
        ]

    def _generate_tokens(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        sampling: SamplingConfig,
        adapter_names: Sequence[str] | None,
        keys: Tensor | None = None,
        record: list[Tensor] | None = None,
    ) -> tuple[Tensor, Tensor]:
        extra = {} if adapter_names is None else {"adapter_names": list(adapter_names)}
        self.activate()
        # eval: no dropout while sampling, and peft's mixed-adapter batches require it.
        with (
            eval_mode(self.model),
            torch.inference_mode(),
            only_our_generation_settings(self.model),
            decode_layout(self.model, input_ids.shape[0]),
            adapter_span_forwards(self.model, adapter_names),
        ):
            # A transformers/PEFT method, which nn.Module types as a Tensor | Module attribute.
            generated = self.model.generate(  # type: ignore[operator]
                **generate_inputs(self.model, input_ids, attention_mask, adapter_names),
                pad_token_id=self.pad_token_id,
                eos_token_id=sorted(self.eos_token_ids),
                return_dict_in_generate=False,
                **sampling.generate_kwargs(keys, record),
                **extra,
            )
        return completion_mask_from_generated(
            generated.cpu(), input_ids.shape[1], self.eos_token_ids
        )

    def logprobs(
        self,
        prompt_ids: Sequence[Sequence[int]],
        completion_ids: Sequence[Sequence[int]],
        *,
        chunk: int | None = None,
    ) -> Tensor:
        """``[B, L]`` log-probs of each completion token (0 elsewhere) from one padded forward;
        ``.sum(-1)`` gives sequence log-probs. Differentiable unless called under ``no_grad``."""
        batch = build_batch(prompt_ids, completion_ids, self.pad_token_id).to(self.device)
        return self.score(batch, chunk=chunk)

    def score(
        self,
        batch: TokenBatch,
        *,
        chunk: int | None = None,
        adapter_names: Sequence[str] | None = None,
        prefix_sharing: bool = False,
        temperature: Temperature = 1.0,
    ) -> Tensor:
        """``[B, L]`` completion log-probs of a built batch at ``temperature``: the
        ``logprobs`` of :meth:`score_tokens`."""
        return self.score_tokens(
            batch,
            chunk=chunk,
            adapter_names=adapter_names,
            prefix_sharing=prefix_sharing,
            temperature=temperature,
        ).logprobs

    def score_tokens(
        self,
        batch: TokenBatch,
        *,
        chunk: int | None = None,
        adapter_names: Sequence[str] | None = None,
        prefix_sharing: bool = False,
        temperature: Temperature = 1.0,
        entropy: bool = False,
        truncation: Truncation | None = None,
    ) -> TokenScores:
        """Completion log-probs (and entropies) of a built batch (the learners' one scoring
        call) under this agent's adapter, prefix-shared or not (``prefix_scoring.py``), or each
        row under its own (``adapter_names``: a mixed-adapter pass, in eval mode as peft
        requires), at the sampling ``temperature`` (one, or one per row); with the rows'
        ``truncation``, also their log-probs under the truncated sampling distribution."""
        score = scorer(prefix_sharing)
        kwargs: dict[str, Any] = {
            "chunk": chunk,
            "temperature": temperature,
            "entropy": entropy,
            "truncation": truncation,
        }
        if adapter_names is None:
            self.activate()
            with gathered_weight_gradients(self.model):
                return score(self.model, batch, **kwargs)
        with eval_mode(self.model), gathered_weight_gradients(self.model):
            return score(self.model, batch, adapter_names=adapter_names, **kwargs)

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | os.PathLike[str],
        *,
        gguf_file: str | None = None,
        tokenizer: Any = None,
        dtype: torch.dtype | str | None = None,
        device: torch.device | str | None = None,
        chat_template: bool | None = None,
        system_prompt: str | None = None,
        model_kwargs: dict[str, Any] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
    ) -> LLMAgent:
        """Load a hub id, a local model folder, or a GGUF file (``name_or_path`` is its folder and
        ``gguf_file`` its name, or ``name_or_path`` is the ``.gguf`` path itself).

        A GGUF file is converted once to a safetensors folder under ``cache_dir`` (see
        :func:`convert_gguf`); later loads read that folder.
        """
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = Path(name_or_path)
        if gguf_file is None and path.suffix == ".gguf" and path.is_file():
            path, gguf_file = path.parent, path.name
        if not gguf_file:
            check_local_model_path(name_or_path)
        source = str(convert_gguf(path, gguf_file, cache_dir) if gguf_file else name_or_path)
        kwargs = dict(model_kwargs or {})
        if dtype is not None:
            kwargs["dtype"] = dtype
        elif "torch_dtype" not in kwargs:
            # the stored dtype, as transformers 5 loads by default (4.x loaded float32)
            kwargs.setdefault("dtype", "auto")
        model = AutoModelForCausalLM.from_pretrained(source, **kwargs)
        if tokenizer is None:
            tokenizer = AutoTokenizer.from_pretrained(source)
        return cls(
            model,
            tokenizer,
            chat_template=chat_template,
            system_prompt=system_prompt,
            device=device,
        )
