"""Configs of the preference-based trainers: ``MADPOConfig`` and ``MARLHFConfig``.

``PreferenceConfig`` holds how pairs are built: each iteration every training item's agents
sample ``preference_num_candidates`` aligned joint candidates (the current policy), which are
labelled (task reward, ``preference_func`` or comparator) and selected by ``pair_selection``.
comlrl's ``MADPOIterConfig`` / ``MARLHFIterConfig`` are aliases: iteration is the
``num_iterations`` field here, not a second class.
"""

from __future__ import annotations

from dataclasses import dataclass

from cmlrl_agents.algorithms.actor_critic_config import IACConfig, MAACConfig
from cmlrl_agents.algorithms.magrpo_config import (
    MAGRPOConfig,
    MAREINFORCEConfig,
    MAReMaxConfig,
    MARLOOConfig,
)
from cmlrl_agents.algorithms.preference_pairs import PAIR_SELECTIONS
from cmlrl_agents.foundation.config import SAMPLING_KEYS, SharedConfig

__all__ = [
    "MADPOConfig",
    "MADPOIterConfig",
    "MARLHFConfig",
    "MARLHFIterConfig",
    "PreferenceConfig",
    "RL_ALGORITHMS",
]

GENERATION_FIELDS = (*SAMPLING_KEYS, "agent_sampling", "generation_backend")
"""What MARLHF's pairs and its RL phase generate with: MARLHF's values (rl_args may leave them
at their defaults or repeat them, never differ)."""
SHARED_FIELDS = (*GENERATION_FIELDS, "early_termination_threshold")
"""MARLHF's values for its RL phase too: the generation settings and the task's termination
threshold (the RL phase plays MARLHF's task, whose spec owns it)."""

RL_CONFIGS: dict[str, type[SharedConfig]] = {
    "magrpo": MAGRPOConfig,
    "mareinforce": MAREINFORCEConfig,
    "maremax": MAReMaxConfig,
    "marloo": MARLOOConfig,
    "iac": IACConfig,
    "maac": MAACConfig,
}
"""The RL phase's config class by ``rl_algorithm``."""
RL_ALGORITHMS = tuple(RL_CONFIGS)


@dataclass
class PreferenceConfig(SharedConfig):
    """Pair building, shared by MADPO and MARLHF (single-turn tasks)."""

    preference_num_candidates: int = 4
    """K joint candidates sampled per training item and iteration (comlrl's default of 80 made
    pair building the whole cost of a run, bug B10)."""
    preference_pairs_per_sample: int | None = 4
    """At most this many pairs per item (None: every labelled pair)."""
    pair_selection: str = "reward_gap"
    """reward_gap (largest task-reward gaps), all, or random (drawn with ``seed``)."""
    eval_interval: int = 1
    """MADPO: evaluate before every ``eval_interval``-th iteration (the first included) and
    after the last; MARLHF: once after the last (its RL phase evaluates on ``rl_args``'
    schedule); 0: manual evaluation only."""
    num_iterations: int = 1
    """Rounds, each building pairs from the current policy (1: offline, pairs from the initial
    policy)."""
    replay_iterations: int = 0
    """Also train on the pairs of this many earlier rounds (0: only the current round's)."""

    def validate(self) -> None:
        super().validate()
        self._int("num_iterations", 1)
        self._int("replay_iterations", 0)
        if self.num_turns not in (None, 1):
            raise ValueError(
                f"num_turns={self.num_turns}: the preference trainers compare single-turn joint "
                "responses; use num_turns=1 or None (multi-turn tasks: MAGRPOConfig, IACConfig)."
            )
        self._int("preference_num_candidates", 2)
        self._int("preference_pairs_per_sample", 1, optional=True)
        self._choice("pair_selection", PAIR_SELECTIONS)
        if self.pair_selection == "all" and self.preference_pairs_per_sample is not None:
            raise ValueError(
                f"pair_selection='all' keeps every pair, but preference_pairs_per_sample="
                f"{self.preference_pairs_per_sample} caps them; set it to None, or use "
                "pair_selection='reward_gap' or 'random'."
            )


@dataclass
class MADPOConfig(PreferenceConfig):
    """Multi-agent DPO against a frozen reference (the initial policy).

    Each of ``num_iterations`` rounds regenerates pairs from the current policy and trains
    ``num_train_epochs`` passes over them (plus the last ``replay_iterations`` rounds' pairs);
    1 is offline DPO.
    """

    dpo_beta: float = 0.1
    """beta of the DPO loss: the weight of the log-ratio to the reference."""
    pair_batch_size: int = 8
    """Pairs per optimizer step."""

    def validate(self) -> None:
        super().validate()
        self._real("dpo_beta", 0.0, low_open=True)
        self._int("pair_batch_size", 1)
        if self.lr_scheduler_type != "constant":
            raise ValueError(
                f"lr_scheduler_type={self.lr_scheduler_type!r}: MADPO's number of optimizer steps "
                "depends on the pairs each round finds, so a decay has no known end; use "
                "'constant' (warmup_steps still works)."
            )


@dataclass
class MARLHFConfig(PreferenceConfig):
    """Pairs → a Bradley-Terry reward model → RL on the learned reward (``rl_args``).

    Each of ``num_iterations`` rounds builds pairs from the current policy, trains the reward
    model further on them (and on the last ``replay_iterations`` rounds' training pairs), then
    runs ``rl_args.num_train_epochs`` epochs of RL on it.
    """

    rl_algorithm: str = "magrpo"
    """The RL phase: magrpo, mareinforce, maremax, marloo, iac or maac."""
    rl_args: SharedConfig | None = None
    """The RL phase's config (None: that algorithm's defaults); its ``output_dir`` None becomes
    ``<output_dir>/rl``. The RL phase generates as the pairs do, with this config's sampling
    fields and ``generation_backend`` (``GENERATION_FIELDS``), through one backend."""
    reward_learning_rate: float = 1e-4
    reward_num_train_epochs: int = 1
    reward_batch_size: int = 8
    reward_eval_fraction: float = 0.2
    """Share of the pairs held out to measure the reward model's pair accuracy."""
    reward_model_device: str | None = None
    """None: CUDA when available, else CPU (never a hard-coded cuda:0, bug B11)."""
    reward_max_length: int | None = 512
    """Tokens kept per reward-model text (left-truncated: the responses are at the end)."""

    def validate(self) -> None:
        super().validate()
        self._choice("rl_algorithm", RL_ALGORITHMS)
        self._check_rl_args()
        self._real("reward_learning_rate", 0.0, low_open=True)
        self._int("reward_num_train_epochs", 1)
        self._int("reward_batch_size", 1)
        self._real("reward_eval_fraction", 0.0, 0.9)
        self._devices("reward_model_device")
        self._int("reward_max_length", 8, optional=True)
        if self.reference_devices is not None:
            raise ValueError(
                f"reference_devices={self.reference_devices!r}: MARLHF has no reference model "
                "of its own; its RL phase places its references with "
                "rl_args.reference_devices (with rl_args.reference_kl_enabled=True)."
            )
        if self.save_best_by is not None or self.load_best_model_at_end:
            raise ValueError(
                f"save_best_by={self.save_best_by!r}, load_best_model_at_end="
                f"{self.load_best_model_at_end!r}: MARLHF's evaluations are its RL phase's; set "
                "them on rl_args (e.g. MAGRPOConfig(save_best_by=...))."
            )

    def _check_rl_args(self) -> None:
        config_class = RL_CONFIGS[self.rl_algorithm]
        rl = self.rl_args
        if rl is None:
            return
        if not isinstance(rl, SharedConfig):
            raise TypeError(
                f"rl_args must be the RL phase's config (e.g. MAGRPOConfig()), got "
                f"{type(rl).__name__}."
            )
        if type(rl) is not config_class:
            raise TypeError(
                f"rl_algorithm={self.rl_algorithm!r} needs rl_args to be a "
                f"{config_class.__name__}, got {type(rl).__name__}; set rl_algorithm to match, "
                f"or pass {config_class.__name__}(...)."
            )
        defaults = config_class()
        for name in SHARED_FIELDS:
            mine, theirs = getattr(self, name), getattr(rl, name)
            if theirs != mine and theirs != getattr(defaults, name):
                raise ValueError(
                    f"rl_args.{name}={theirs!r} differs from {name}={mine!r}: MARLHF's pairs and "
                    f"its RL phase share one setting, this config's; set {name} on "
                    f"{type(self).__name__} and leave rl_args.{name} at its default."
                )
        if rl.num_turns not in (None, 1):
            raise ValueError(
                f"rl_args.num_turns={rl.num_turns}: the reward model scores single-turn joint "
                "responses; use num_turns=1 or None."
            )
        if self.num_iterations > 1 and rl.lr_scheduler_type != "constant":
            raise ValueError(
                f"rl_args.lr_scheduler_type={rl.lr_scheduler_type!r} with num_iterations="
                f"{self.num_iterations}: the RL phase's schedule is built for one round's epochs, "
                "so a decay would end in round 0; use 'constant' (warmup_steps still works), or "
                "num_iterations=1."
            )


MADPOIterConfig = MADPOConfig
"""comlrl's iterative-DPO name: ``num_iterations`` rounds regenerate pairs here."""
MARLHFIterConfig = MARLHFConfig
"""comlrl's iterative-MARLHF name: ``num_iterations`` rounds of pairs, reward model and RL."""
