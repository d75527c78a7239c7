"""A reward model learned from preferences, usable as a plain ``reward_func`` (SPEC §4).

:class:`PreferenceRewardModel` wraps a sequence-classification model with one output (e.g.
``AutoModelForSequenceClassification.from_pretrained(path, num_labels=1)``) that reads a joint
response as one text (:func:`joint_text`: the item's prompt, then each agent's response).
:meth:`~PreferenceRewardModel.fit` trains it with the Bradley-Terry loss on preference pairs and
reports the pair accuracy on held-out pairs (one update of its learner,
:mod:`cmlrl_agents.algorithms.reward_learner`). Called as ``reward_model(c1, c2, batch_items=...)``
it returns one reward per joint response, without gradients and without moving or updating
anything: a trainer only uses the returned values.

Device: given, else CUDA when there is one, else CPU (the reference defaulted to ``cuda:0`` and
crashed on CPU-only machines, bug B11).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from cmlrl_agents.algorithms.preference_pairs import PreferencePair
from cmlrl_agents.algorithms.reward_learner import RewardFit, RewardFitArgs, RewardModelLearner
from cmlrl_agents.functional.preference_losses import pair_accuracy

__all__ = ["PreferenceRewardModel", "joint_text", "split_pairs"]


def joint_text(completions: Sequence[str], item: Mapping[str, Any] | None) -> str:
    """The text a reward model reads for one joint response: the task prompt (when the item has
    a string ``"prompt"``) and each agent's response, labelled in actor order."""
    parts = []
    if item is not None and isinstance(item.get("prompt"), str):
        parts.append(f"Task: {item['prompt']}")
    parts.extend(f"Agent {a + 1} response:\n{text}" for a, text in enumerate(completions))
    return "\n\n".join(parts)


def split_pairs(
    pairs: Sequence[PreferencePair], eval_fraction: float, seed: int | None
) -> tuple[list[PreferencePair], list[PreferencePair]]:
    """A seeded shuffle split into (train, held-out); held-out gets ``round(fraction * n)``
    pairs, at least one when the fraction is positive and at least one pair is left to train."""
    order = list(pairs)
    random.Random(seed).shuffle(order)
    held = round(eval_fraction * len(order))
    if eval_fraction > 0 and len(order) >= 2:
        held = min(max(held, 1), len(order) - 1)
    return order[held:], order[:held]


def _default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


class PreferenceRewardModel:
    """A one-output sequence-classification model as a reward over joint responses."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        *,
        device: str | torch.device | None = None,
        max_length: int | None = 512,
        forward_batch_size: int | None = None,
    ) -> None:
        if forward_batch_size is not None and (
            isinstance(forward_batch_size, bool) or forward_batch_size < 1
        ):
            raise ValueError(
                f"forward_batch_size={forward_batch_size!r} must be a positive number of texts "
                "per forward pass, or None (all at once)."
            )
        labels = getattr(getattr(model, "config", None), "num_labels", None)
        if labels != 1:
            raise ValueError(
                f"the reward model must output one score per text (config.num_labels=1), got "
                f"num_labels={labels!r}; load it with "
                "AutoModelForSequenceClassification.from_pretrained(path, num_labels=1)."
            )
        config: Any = model.config  # a transformers config (its num_labels was read above)
        # The model scores each row at its last token that is not config.pad_token_id, so rows
        # are padded with that id (Llama-2's config names 0 where its tokenizer has no pad);
        # without one, with the tokenizer's pad or EOS, which the config is then given.
        pad = next(
            (p for p in (config.pad_token_id, tokenizer.pad_token_id, tokenizer.eos_token_id)
             if p is not None),
            None,
        )  # fmt: skip
        if pad is None:
            raise ValueError(
                "the reward model has no pad token: neither its config nor its tokenizer names "
                "a pad or an EOS token; set model.config.pad_token_id."
            )
        self.pad_token_id = config.pad_token_id = int(pad)
        self.device = torch.device(device) if device is not None else _default_device()
        self.model = model.to(self.device).eval()
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.forward_batch_size = forward_batch_size
        """Texts per forward pass when scoring (None: all at once); a fit backpropagates half
        as many pairs at a time (their two texts each), adding up the step's gradients."""
        self._frozen: list[torch.nn.Parameter] = []
        """The parameters :meth:`freeze` froze, which :meth:`unfreeze` makes trainable again."""

    @classmethod
    def from_pretrained(
        cls, name_or_path: str | Path, *, device: str | None = None, **kwargs: Any
    ) -> PreferenceRewardModel:
        """Load a backbone (hub id or local folder) with a fresh one-output score head."""
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(name_or_path)
        model = AutoModelForSequenceClassification.from_pretrained(
            name_or_path, num_labels=1, dtype=torch.float32
        )
        return cls(model, tokenizer, device=device, **kwargs)

    def _batch(self, texts: Sequence[str]) -> tuple[Tensor, Tensor]:
        rows = self.tokenizer(list(texts), add_special_tokens=True)["input_ids"]
        if self.max_length is not None:  # keep the end: the responses come last
            rows = [row[-self.max_length :] for row in rows]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for b, row in enumerate(rows):
            ids[b, : len(row)] = torch.as_tensor(row, dtype=torch.long)
            mask[b, : len(row)] = 1
        return ids.to(self.device), mask.to(self.device)

    def score(self, texts: Sequence[str]) -> Tensor:
        """``[B]`` scores of ``texts`` (differentiable unless called under ``no_grad``), one
        forward of ``forward_batch_size`` texts at a time."""
        size = self.forward_batch_size or max(len(texts), 1)
        parts = []
        for start in range(0, len(texts), size):
            ids, mask = self._batch(texts[start : start + size])
            logits: Tensor = self.model(input_ids=ids, attention_mask=mask).logits
            parts.append(logits[:, 0].float())
        return torch.cat(parts) if parts else torch.zeros(0, device=self.device)

    def __call__(
        self, *completions: list[str], batch_items: Sequence[Mapping[str, Any]] | None = None
    ) -> list[float]:
        """A ``reward_func``: one list of completions per agent, one reward per joint response."""
        item = batch_items[0] if batch_items else None
        texts = [joint_text(joint, item) for joint in zip(*completions, strict=True)]
        self.model.eval()
        with torch.no_grad():
            return [float(s) for s in self.score(texts)]

    def pair_scores(self, pairs: Sequence[PreferencePair]) -> tuple[Tensor, Tensor]:
        chosen = self.score([joint_text(p.chosen, p.item) for p in pairs])
        rejected = self.score([joint_text(p.rejected, p.item) for p in pairs])
        return chosen, rejected

    def accuracy(self, pairs: Sequence[PreferencePair]) -> float:
        """Share of ``pairs`` whose chosen joint response scores higher."""
        self.model.eval()
        with torch.no_grad():
            return pair_accuracy(*self.pair_scores(pairs))

    def fit(
        self,
        train_pairs: Sequence[PreferencePair],
        eval_pairs: Sequence[PreferencePair] = (),
        *,
        learning_rate: float = 1e-4,
        epochs: int = 1,
        batch_size: int = 8,
        max_grad_norm: float | None = 1.0,
        seed: int | None = None,
        weight_decay: float = 0.0,
        lr_scheduler_type: str = "constant",
        warmup_steps: int = 0,
    ) -> dict[str, float]:
        """Bradley-Terry training, ``batch_size`` pairs per optimizer step (scored
        ``forward_batch_size`` pairs per forward), with AdamW at ``weight_decay`` and the
        ``lr_scheduler_type`` / ``warmup_steps`` schedule over this fit's steps, each epoch
        shuffled by ``seed``: one update of a
        :class:`~cmlrl_agents.algorithms.reward_learner.RewardModelLearner`. Returns
        ``reward_model/loss`` (last epoch's mean), ``reward_model/train_accuracy`` and, with
        ``eval_pairs``, ``reward_model/eval_accuracy`` (held-out pairs, before:
        ``reward_model/eval_accuracy_before``).

        Each fit starts a fresh optimizer and schedule from the current weights, so the
        weights are the whole state between fits (a resumed MARLHF run fits as an
        uninterrupted one)."""
        args = RewardFitArgs(
            learning_rate=learning_rate,
            epochs=epochs,
            batch_size=batch_size,
            max_grad_norm=max_grad_norm,
            weight_decay=weight_decay,
            lr_scheduler_type=lr_scheduler_type,
            warmup_steps=warmup_steps,
        )
        fit = RewardFit(tuple(train_pairs), tuple(eval_pairs), seed)
        return RewardModelLearner(self, args).update(fit)

    def freeze(self) -> PreferenceRewardModel:
        """No parameter of the model requires gradients any more (it is only a reward now)."""
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        if trainable:  # freezing twice keeps the first list
            self._frozen = trainable
        for p in trainable:
            p.requires_grad_(False)
        self.model.eval()
        return self

    def unfreeze(self) -> PreferenceRewardModel:
        """Undo :meth:`freeze`: the parameters that were trainable before it train again (a
        backbone the user froze stays frozen), e.g. to :meth:`fit` it on new pairs."""
        for p in self._frozen:
            p.requires_grad_(True)
        self._frozen = []
        return self
