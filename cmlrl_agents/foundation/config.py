"""Validated config dataclasses shared by every trainer.

A config checks itself in ``__post_init__`` and again on every assignment, because users set
fields after construction (SPEC §5: ``trainer.args.eval_num_samples = len(eval_dataset)``). No other
code re-checks a field. Messages name the field, quote the value and say what is allowed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cmlrl_agents.foundation.validated import ValidatedConfig
from cmlrl_env.core import DEFAULT_EARLY_TERMINATION_THRESHOLD

if TYPE_CHECKING:
    from cmlrl_agents.policies.agent import SamplingConfig

__all__ = ["FROM_TASK", "SharedConfig", "ValidatedConfig"]

LR_SCHEDULER_TYPES = ("constant", "linear", "cosine")
"""The learning-rate shapes after warmup (``transformers.get_scheduler``'s, see schedules.py)."""

SAMPLING_KEYS = ("max_new_tokens", "min_new_tokens", "temperature", "top_p", "top_k")
"""The generation settings ``agent_sampling`` may set per agent."""

GENERATION_BACKENDS = ("hf", "hf_bf16", "vllm")
# The backends that sample from weights other than the trainer's: their completions carry the
# sampler's log-probs, and the loss weights each token by the truncated importance ratio.
SEPARATE_SAMPLERS = ("hf_bf16", "vllm")

FROM_TASK = "task"
"""``early_termination_threshold``'s default: the task's own threshold (``env=``/``task=`` own
it), else the env's default for a task the trainer builds."""

MAX_SEED = 2**32 - 1
"""numpy's ``np.random.seed`` accepts 0 .. 2**32 - 1."""


@dataclass
class SharedConfig(ValidatedConfig):
    """Fields every trainer has: team, turns, sampling, schedule, logging, checkpoints."""

    num_agents: int | None = None
    """Team size; None takes it from the trainer (``num_agents=``, ``agents=`` or formatters)."""
    num_turns: int | None = None
    """Turns per episode. The task owns them: None takes those of ``env=``/``task=``, or 1 for
    a task the trainer builds from ``formatters``/``reward_func``; a number builds a multi-turn
    task that way (comlrl's form; >1 needs ``external_transition``) and, beside ``env=`` or
    ``task=``, must equal the task's."""
    num_train_epochs: int = 1
    """Passes over the training task items (>= 1; to only evaluate, call ``evaluate()``)."""
    agent_learning_rate: float = 5e-6
    """AdamW learning rate of every agent."""
    lr_scheduler_type: str = "constant"
    """Learning-rate shape after warmup: "constant", "linear" or "cosine" (to 0 at the run's
    last optimizer step; needs a map-style train_dataset). Applies to every optimizer."""
    warmup_steps: int = 0
    """Optimizer steps of linear warmup from 0 to the learning rate (0: none)."""
    max_new_tokens: int = 128
    """Generation cap per completion (tokens)."""
    min_new_tokens: int = 0
    """No EOS before this many tokens (0: off); used to force equal lengths in benchmarks."""
    temperature: float = 0.6
    top_p: float = 0.6
    top_k: int | None = 50
    agent_sampling: list[dict[str, Any]] | None = None
    """Per-agent sampling: one dict per agent overriding any of ``max_new_tokens``,
    ``min_new_tokens``, ``temperature``, ``top_p``, ``top_k`` for that agent (``{}`` keeps the
    shared fields). Adapter agents of one base share one generate call only when their settings
    are equal: rows are grouped by settings, one call per distinct setting."""
    generation_backend: str = "hf"
    """"hf" (transformers ``generate``), "hf_bf16" (the same on a bfloat16 copy of each agent,
    synced after each update: about half the decoding time on a CPU, with ``tis_cap``'s
    correction; docs/training.md) or "vllm" (the optional ``cmlrl[vllm]`` extra; serves the
    adapters of LoRA agents per request and reloads them after each update)."""
    discount: float = 1.0
    """Weight of later turns in a turn's return."""
    early_termination_threshold: float | str | None = FROM_TASK
    """A branch ends after a turn whose reward exceeds this (None: always play every turn).
    "task" (the default): the threshold of ``env=``/``task=``, or the env's default (-0.2) for
    a task the trainer builds; a number given beside ``env=``/``task=`` must equal the task's."""
    eval_interval: int = 16
    """Evaluate before item 0 of each epoch and then every ``eval_interval`` training task items;
    0: manual evaluation only."""
    eval_num_samples: int = 4
    """How many items from the start of the eval split each evaluation scores (> 0)."""
    eval_batch_size: int = 1
    """Items per generation batch in evaluation (batching only, not the number of responses)."""
    logging_steps: int = 1
    """Minimum ``env_step`` gap between training log entries; entries in a gap are averaged."""
    max_grad_norm: float | None = 1.0
    """Clip each agent's gradient norm (None: no clipping)."""
    weight_decay: float = 0.0
    """AdamW's decoupled weight decay of every optimizer (0: none, as in Hugging Face's
    Trainer; torch's own AdamW default of 0.01 is not used)."""
    adam_beta1: float = 0.9
    """AdamW's first-moment decay (momentum) of every agent's and critic's optimizer, Hugging
    Face's name and default; 0 steps on each round's gradient alone, in [0, 1)."""
    adam_beta2: float = 0.999
    """AdamW's second-moment decay of every agent's and critic's optimizer, in [0, 1)."""
    adam_epsilon: float = 1e-8
    """AdamW's epsilon of every agent's and critic's optimizer (> 0)."""
    tis_cap: float = 2.0
    """With ``generation_backend="vllm"`` or ``"hf_bf16"``: each token's policy term is weighted
    by the truncated importance ratio ``min(pi_trainer / pi_sampler, tis_cap)`` (TRL's and
    verl's TIS), correcting for the sampler's numerics; >= 1."""
    disable_dropout: bool = True
    """Set every dropout rate of the agents (and of the critics) to 0 when the trainer is built,
    as TRL's ``disable_dropout``: each scoring pass of one weight state is then one function,
    so a stale step's ratio to its "old" log-probs is exactly 1 before the policy moves (the
    measurement with dropout kept: docs/training.md). False keeps dropout in the training
    passes (peft's ``lora_dropout``, a model's ``attention_dropout``)."""
    bf16: bool = False
    """Run the training passes (the forwards of the agents' and critics' losses, their
    references, and the passes their numbers are compared with: a round's old log-probs, DPO's
    reference log-probs) under bfloat16 autocast, as TRL's ``bf16=True`` (MARLHF's reward model
    fits in float32); weights, gradients and AdamW states stay float32, and sampling and
    evaluation run as the model is loaded. Faster where bfloat16 matrix multiplies are (GPUs;
    CPUs with AVX512-BF16 or AMX), with bfloat16's rounding in the log-probs. Off by default;
    its speed and its learning over seeds are in docs/benchmarks.md and docs/experiments.md."""
    log_entropy: bool = True
    """Log each agent's mean per-token policy entropy (computed from the scoring pass's logits,
    without gradient)."""
    seed: int | None = 42
    """Seed python, numpy and torch before any model is built and at the start of ``train()``,
    and key the run's sampling with it, so a run repeats as it is (Hugging Face's and TRL's
    default, 42). None: leave the global streams as they are and draw the sampling seed at
    random; ``config.json`` records the one drawn as ``sample_seed``."""
    output_dir: str | None = None
    """Local metrics, config, plots and checkpoints.

    None: ``runs/<algorithm>-<date>-<time>-<run id>``, a new folder per trainer."""
    # comlrl's name (users rely on it): the task items of one round, not a replay buffer.
    rollout_buffer_size: int = 2
    """Task items rolled out together (one batched generate per agent and turn) per update."""
    train_batch_size: int | None = None
    """Task items per optimizer step within an update (None: the whole buffer, one step)."""
    forward_batch_size: int | None = 8
    """Sequences per forward/backward pass (gradients accumulated: the result does not depend on
    it). Bounds activation memory: a two-turn MAGRPO round of 4 items scores 80 completions per
    agent, which peaks at 18.4 GB for SmolLM2-135M in one pass and 4.9 GB in passes of 8.
    None: all in one pass."""
    verbose: bool | None = None
    """Progress and eval lines: True a progress bar, False nothing. None: as
    ``wandb_config["config_sections"]["output"]["verbose"]`` says, else a bar in a terminal and
    a progress line after a round, at most one a minute, elsewhere (a notebook, a log file)."""
    save_steps: int = 0
    """Checkpoint every ``save_steps`` training task items and at the end (0: only on request)."""
    save_total_limit: int | None = None
    """Keep the newest ``save_total_limit`` checkpoints (None: keep all)."""
    save_only_model: bool = False
    """Checkpoints hold the weights alone (Hugging Face's name): no AdamW state, which is twice
    the size of the trained weights (3.1 GB for two fully trained SmolLM2-135M agents); such a
    checkpoint can be evaluated or exported with save_model, not resumed."""
    save_best_by: str | None = None
    """An evaluation metric (e.g. ``"eval/turn_1/reward_mean"``): training keeps the weights of
    its best evaluation in ``output_dir/best/`` (HF's ``metric_for_best_model``); needs
    ``eval_interval > 0`` and an eval dataset."""
    greater_is_better: bool = True
    """Whether a larger ``save_best_by`` value is better."""
    load_best_model_at_end: bool = False
    """After training, load the weights kept by ``save_best_by`` (HF's name)."""
    overwrite_output_dir: bool = False
    """Let a fresh ``train()`` start in an ``output_dir`` that holds another run's checkpoints
    (they are deleted). False: such a folder is refused unless ``train()`` resumes from it."""
    agent_devices: str | list[str] | None = None
    """Where each agent lives: one device for all ("cuda:0", "cpu"), one per agent
    (["cuda:0", "cuda:1"]), or "auto" (agent i on cuda:i when there are enough GPUs, else all on
    cuda:0; cpu without CUDA). None: where the model already is (or ``model_config["device"]``)."""
    reference_devices: str | list[str] | None = None
    """Where the frozen reference copies live when the reference KL is on (None: beside their
    agent). Same forms as ``agent_devices``."""
    parallel_training: str | None = None
    """comlrl's switch; only None or "none" (see validate() for why "mp" is refused)."""
    num_threads: int | None = None
    """CPU threads of PyTorch, set at the start of ``train()``. None keeps PyTorch's count (one
    per physical core, or ``OMP_NUM_THREADS``), so runs on one machine repeat exactly; on a
    machine that other jobs keep busy, fewer threads train much faster, and ``train()`` warns
    with the count to use (``cmlrl_agents/runs/threads.py``)."""

    def validate(self) -> None:
        self._int("num_agents", 1, optional=True)
        self._int("num_turns", 1, optional=True)
        self._int("num_train_epochs", 1)
        self._real("agent_learning_rate", 0.0, low_open=True)
        self._choice("lr_scheduler_type", LR_SCHEDULER_TYPES)
        self._int("warmup_steps", 0)
        self._int("max_new_tokens", 1)
        self._real("temperature", 0.0, low_open=True)
        self._real("top_p", 0.0, 1.0, low_open=True)
        self._int("top_k", 1, optional=True)
        self._int("min_new_tokens", 0)
        self._check_generation()
        self._real("discount", 0.0, 1.0)
        threshold = self.early_termination_threshold
        if isinstance(threshold, str) and threshold != FROM_TASK:
            raise TypeError(
                f"early_termination_threshold must be a number, None (play every turn) or "
                f"{FROM_TASK!r} (the task's), got {threshold!r}."
            )
        if threshold != FROM_TASK:
            self._real("early_termination_threshold", optional=True)
        self._int("eval_interval", 0)
        self._int("eval_num_samples", 1)
        self._int("eval_batch_size", 1)
        self._int("logging_steps", 1)
        self._check_optimizer_step()
        self._real("tis_cap", 1.0)
        self._bool("log_entropy")
        self._bool("disable_dropout")
        self._bool("bf16")
        self._check_seed_and_folder()
        self._int("rollout_buffer_size", 1)
        self._int("train_batch_size", 1, optional=True)
        self._int("forward_batch_size", 1, optional=True)
        if self.train_batch_size is not None and self.train_batch_size > self.rollout_buffer_size:
            raise ValueError(
                f"train_batch_size={self.train_batch_size} is larger than rollout_buffer_size="
                f"{self.rollout_buffer_size}; an optimizer step cannot use more items than one "
                "rollout collects. Lower train_batch_size or raise rollout_buffer_size."
            )
        if self.verbose is not None:
            self._bool("verbose")
        self._int("save_steps", 0)
        self._int("save_total_limit", 1, optional=True)
        self._bool("overwrite_output_dir")
        self._check_best()
        self._devices("agent_devices")
        self._devices("reference_devices")
        self._int("num_threads", 1, optional=True)
        if self.parallel_training not in (None, "none"):
            raise ValueError(
                f"parallel_training={self.parallel_training!r} (comlrl's threaded model "
                "parallelism) is not needed here: place each agent with agent_devices=['cuda:0', "
                "'cuda:1', ...] and each agent's generate and update run on its own device; "
                "throughput comes from batching (rollout_buffer_size items per batched generate, "
                "forward_batch_size for scoring). Leave parallel_training unset."
            )

    def _check_optimizer_step(self) -> None:
        """The gradient clip and AdamW's settings besides the rate."""
        self._real("max_grad_norm", 0.0, low_open=True, optional=True)
        self._real("weight_decay", 0.0)
        for name in ("adam_beta1", "adam_beta2"):
            self._real(name, 0.0)
            if getattr(self, name) >= 1.0:
                raise ValueError(
                    f"{name} must be in [0, 1) (a moment average that never forgets), got "
                    f"{getattr(self, name)}; Hugging Face's defaults are 0.9 and 0.999."
                )
        self._real("adam_epsilon", 0.0, low_open=True)

    def _check_seed_and_folder(self) -> None:
        self._int("seed", 0, optional=True)
        if self.seed is not None and self.seed > MAX_SEED:
            raise ValueError(
                f"seed must be <= {MAX_SEED} (numpy's seed range, 2**32 - 1), got {self.seed}."
            )
        if self.output_dir is not None and not isinstance(self.output_dir, str):
            raise TypeError(f"output_dir must be a str path or None, got {self.output_dir!r}.")
        if self.output_dir is not None and not self.output_dir.strip():
            raise ValueError(
                f"output_dir={self.output_dir!r} is empty; give a folder path, or None for "
                "runs/<algorithm>-<time>."
            )

    def _check_stale_rounds(self, clip_range: float | None, steps: str, epochs: int) -> None:
        """A round of several optimizer steps (``epochs`` passes, or several windows) trains its
        later steps on samples of a policy that has moved since: the importance ratio needs
        ``ppo_clip_range``."""
        if clip_range is None and epochs > 1:
            raise ValueError(
                f"ppo_epochs={epochs} needs ppo_clip_range (e.g. 0.2): after the first "
                "pass the samples are off-policy, and only the clipped ratio corrects for that. "
                "Set ppo_clip_range or use ppo_epochs=1."
            )
        if clip_range is None and self.items_per_step < self.rollout_buffer_size:
            raise ValueError(
                f"train_batch_size={self.train_batch_size} < rollout_buffer_size="
                f"{self.rollout_buffer_size} gives a round several {steps}, whose later "
                "steps train on samples of a policy that has moved since; that needs "
                "ppo_clip_range (e.g. 0.2) for the importance ratio, or train_batch_size=None."
            )

    def _check_best(self) -> None:
        self._bool("save_only_model")
        self._bool("greater_is_better")
        self._bool("load_best_model_at_end")
        name = self.save_best_by
        if name is not None and (not isinstance(name, str) or not name.startswith("eval/")):
            raise ValueError(
                f"save_best_by must be an evaluation metric such as 'eval/turn_1/reward_mean' "
                f"(or None), got {name!r}."
            )
        if name is not None and not self.eval_interval:
            raise ValueError(
                f"save_best_by={name!r} needs evaluations during training; set eval_interval "
                "> 0 (and give an eval_dataset)."
            )
        if self.load_best_model_at_end and name is None:
            raise ValueError(
                "load_best_model_at_end=True needs save_best_by (the metric that picks the best "
                "model), e.g. save_best_by='eval/turn_1/reward_mean'."
            )

    def _check_generation(self) -> None:
        if self.min_new_tokens > self.max_new_tokens:
            raise ValueError(
                f"min_new_tokens={self.min_new_tokens} is larger than max_new_tokens="
                f"{self.max_new_tokens}; lower min_new_tokens or raise max_new_tokens."
            )
        self._choice("generation_backend", GENERATION_BACKENDS)
        value = self.agent_sampling
        if value is None:
            return
        if not isinstance(value, list) or not all(isinstance(d, dict) for d in value):
            raise TypeError(
                f"agent_sampling must be None or a list of dicts (one per agent), got {value!r}."
            )
        if self.num_agents is not None and len(value) != self.num_agents:
            raise ValueError(
                f"agent_sampling has {len(value)} entries but num_agents={self.num_agents}; give "
                "one dict per agent ({} keeps the shared settings)."
            )
        for i, overrides in enumerate(value):
            self.sampling_for(i, overrides)

    def sampling_for(self, agent: int, overrides: dict[str, Any] | None = None) -> SamplingConfig:
        """Agent ``agent``'s ``SamplingConfig``: the shared fields with its ``agent_sampling``
        entry applied."""
        from cmlrl_agents.policies.agent import SamplingConfig

        if overrides is None:
            overrides = {} if self.agent_sampling is None else self.agent_sampling[agent]
        unknown = sorted(set(overrides) - set(SAMPLING_KEYS))
        if unknown:
            raise ValueError(
                f"agent_sampling[{agent}] has unknown key(s) {unknown}; valid keys: "
                f"{list(SAMPLING_KEYS)}."
            )
        fields_ = {key: getattr(self, key) for key in SAMPLING_KEYS} | overrides
        try:
            return SamplingConfig(**fields_)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"agent_sampling[{agent}]={overrides!r}: {exc}") from None

    def task_settings(self) -> dict[str, Any]:
        """``num_turns`` and ``early_termination_threshold`` of a task built from this config's
        fields, the task's defaults where they are unset (1 turn, the env's threshold)."""
        threshold = self.early_termination_threshold
        return {
            "num_turns": 1 if self.num_turns is None else self.num_turns,
            "early_termination_threshold": (
                DEFAULT_EARLY_TERMINATION_THRESHOLD if threshold == FROM_TASK else threshold
            ),
        }

    @property
    def items_per_step(self) -> int:
        """Task items per optimizer step."""
        return self.train_batch_size or self.rollout_buffer_size
