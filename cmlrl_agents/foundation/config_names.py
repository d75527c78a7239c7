"""Names from TRL and transformers' ``TrainingArguments`` that the configs here spell otherwise.

A user coming from TRL writes ``MAGRPOConfig(learning_rate=...)`` or ``max_completion_length``;
a bare ``TypeError: unexpected keyword argument`` does not say what to write instead. One table
serves Python (a config built or assigned with such a name) and the ``cmlrl`` command (a run
file's ``config`` section), and the message names the field of *that* config class.

Where TRL's name already means the same here, the config uses it (``SAME_AS_TRL``). The names
of ``FOREIGN_NAMES`` are not accepted as aliases: each differs a little in meaning (task items,
not examples per device; one rate for every agent, not one model), and a field with two names
could be given twice, once under each.
"""

from __future__ import annotations

import dataclasses
import difflib

__all__ = ["FOREIGN_NAMES", "SAME_AS_TRL", "unknown_field_message"]

SAME_AS_TRL = (
    *("num_generations", "num_train_epochs", "temperature", "top_p", "top_k", "seed"),
    *("output_dir", "logging_steps", "save_steps", "save_total_limit", "max_grad_norm"),
    *("weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon"),
    *("warmup_steps", "lr_scheduler_type", "bf16"),
)
"""TRL's names that the configs use with TRL's meaning."""

_BATCH = (
    "batches here count task items: rollout_buffer_size items are rolled out together, "
    "train_batch_size of them make one optimizer step, and forward_batch_size sequences go "
    "through one forward pass (memory only; the result does not depend on it)"
)

_EVAL = "training task items between evaluations (0: manual evaluation only)"

FOREIGN_NAMES: dict[str, tuple[tuple[str, ...], str | dict[str, str]]] = {
    # TRL's name: (the fields that take its role, first present wins; what to know, or per
    # field what to know)
    "learning_rate": (
        ("agent_learning_rate",),
        "AdamW learning rate of every agent (a critic's is critic_learning_rate)",
    ),
    "max_completion_length": (("max_new_tokens",), "tokens generated per completion at most"),
    "max_prompt_length": (
        (),
        "prompts are not truncated here; the env's max_prompt_chars refuses longer prompts",
    ),
    "beta": (
        ("dpo_beta", "reference_kl_coef"),
        {
            "dpo_beta": "the DPO loss's pull towards the reference model",
            "reference_kl_coef": "the pull towards the reference model (it needs "
            "reference_kl_enabled=True)",
        },
    ),
    "num_iterations": (
        ("ppo_epochs",),
        "passes over each round's rows, the later ones with PPO's clipped ratio",
    ),
    "report_to": (
        (),
        "W&B is on when the trainer gets wandb_config={'project': ...}; metrics.jsonl, "
        "metrics.csv and TensorBoard files are always written to output_dir",
    ),
    "run_name": ((), "give the W&B run name as wandb_config={'name': ...}"),
    "logging_dir": (("output_dir",), "the run folder holds the metric and TensorBoard files"),
    "per_device_train_batch_size": (("rollout_buffer_size", "train_batch_size"), _BATCH),
    "generation_batch_size": (("rollout_buffer_size",), _BATCH),
    "gradient_accumulation_steps": (("train_batch_size", "forward_batch_size"), _BATCH),
    "per_device_eval_batch_size": (("eval_batch_size",), "task items per generation batch"),
    "eval_steps": (("eval_interval",), _EVAL),
    "eval_strategy": (("eval_interval",), _EVAL),
    "evaluation_strategy": (("eval_interval",), _EVAL),
    "save_strategy": (("save_steps",), "training task items between checkpoints (0: on request)"),
    "max_steps": (("num_train_epochs",), "runs are counted in passes over the task items"),
    "scale_rewards": (
        ("advantage_normalization",),
        "in the MAGRPO family TRL's values: 'group' (or True), 'batch', 'none' (or False); "
        "in the actor-critics True z-scores the round's advantages",
    ),
    "loss_type": (
        ("loss_aggregation",),
        "sequence_sum, token_mean (TRL's 'dapo') or sequence_mean (TRL's 'grpo')",
    ),
    "use_vllm": (("generation_backend",), "generation_backend='vllm' (the cmlrl[vllm] extra)"),
    "fp16": (
        ("bf16",),
        "bf16=True autocasts the training passes (fp16 needs a loss scaler, which is not here); "
        "model_config={'dtype': ...} sets the base's load dtype",
    ),
}


COMLRL_NAMES: dict[str, tuple[tuple[str, ...], str]] = {
    # comlrl's name for what a field here does (docs/comlrl.md): as FOREIGN_NAMES
    "checkpoint_dir": (("output_dir",), "checkpoints go to output_dir/checkpoints"),
    "checkpoint_interval": (("save_steps",), "training task items between checkpoints"),
    "checkpoint_total_limit": (("save_total_limit",), "the newest checkpoints kept"),
}


def unknown_field_message(config_class: type, name: str) -> str:
    """Why ``name`` is not a field of ``config_class``, and what to write instead."""
    fields = [f.name for f in dataclasses.fields(config_class)]
    where = f"{config_class.__name__} has no field {name!r}"
    known = {k: (*v, "TRL's") for k, v in FOREIGN_NAMES.items()}
    known |= {k: (*v, "comlrl's") for k, v in COMLRL_NAMES.items()}
    if name in known:
        targets, notes, origin = known[name]
        present = [t for t in targets if t in fields]
        if present:
            note = notes[present[0]] if isinstance(notes, dict) else notes
            return f"{where} ({origin} name); use {present[0]}: {note}."
        if targets:
            verb = "belongs" if len(targets) == 1 else "belong"
            elsewhere = " and ".join(targets)
            return (
                f"{where} ({origin} name), nor a counterpart: {elsewhere} {verb} to other configs."
            )
        return f"{where} ({origin} name): {notes}."
    close = difflib.get_close_matches(name, fields, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"{where}{hint}; valid fields: {', '.join(fields)}."
