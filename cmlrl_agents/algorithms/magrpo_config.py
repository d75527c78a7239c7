"""``MAGRPOConfig`` and the REINFORCE-family configs (MAREINFORCE, MAReMax, MARLOO).

The four algorithms share one trainer and differ only in their default baseline and
normalisation: the baseline (``advantage_mode``) and the std scaling
(``advantage_normalization``) are separate switches, and the scaling never re-centres the
advantages, so the variants really differ (in the reference they all collapse to one, bug B7).
"""

from __future__ import annotations

from dataclasses import dataclass

from cmlrl_agents.foundation.config import SharedConfig

__all__ = ["MAGRPOConfig", "MAREINFORCEConfig", "MAReMaxConfig", "MARLOOConfig"]

JOINT_MODES = ("aligned", "cross")
ADVANTAGE_MODES = ("mean", "rloo", "max", "raw")
ADVANTAGE_SCALES = ("group", "batch", "none")
# functional.losses.AGGREGATIONS, spelled out: configs load without torch (tested equal).
LOSS_AGGREGATIONS = ("sequence_sum", "token_mean", "sequence_mean")


@dataclass
class MAGRPOConfig(SharedConfig):
    """Multi-agent group-relative policy optimisation (SPEC §5–§6).

    Each agent samples ``num_generations`` completions per state; ``joint_mode="aligned"`` pairs
    them by index (G joint actions), ``"cross"`` takes every combination (G**N). In multi-turn
    training every joint action that goes on is expanded into G children; a turn's return is its
    reward plus ``discount`` times the mean return of its children.
    """

    num_generations: int = 4
    """G: completions sampled per agent per state (>= 2 unless ``advantage_mode="raw"``)."""
    joint_mode: str = "aligned"
    advantage_mode: str = "mean"
    """Baseline over the G siblings: mean, rloo (leave-one-out), max, or raw (none)."""
    # The seed's and comlrl's name, kept because users set it; in the MAGRPO family it means
    # std scaling without re-centring, in the actor-critics a z-score (see ActorCriticConfig).
    advantage_normalization: bool | str = True
    """Divide advantages by a return std (no re-centring): True or "group", each state's G
    siblings' std; "batch", the std of every return of the round at that turn (over all ranks:
    TRL's ``scale_rewards="batch"``); False or "none", no scaling. Anything but False/"none" is
    refused with ``advantage_mode="raw"``, which has no baseline (equal returns would be
    amplified)."""
    agent_learning_rate: float = 1e-4
    """AdamW learning rate of every agent. 1e-4, not the shared 5e-6 (comlrl's default, which
    learned less per round): on the seed's length-ratio program, one epoch at 2 items per round,
    it raised all three seeds (mean 0.39 -> 0.72; 0.63 over six seeds) where 5e-5 at 4 items
    reached 0.42 and 2e-4 spread more between seeds than it gained (benchmarks/defaults.py;
    every run in docs/experiments.md, "Why the MAGRPO defaults")."""
    loss_aggregation: str = "sequence_sum"
    """sequence_sum: -A·Σ log π per completion, averaged (MAGRPO's and comlrl's); token_mean:
    averaged over all tokens (TRL's "dapo"); sequence_mean: each completion's mean over its own
    tokens, averaged (TRL's "grpo"), so a short completion's tokens weigh more than a long one's."""
    rollout_buffer_size: int = 2
    """Task items rolled out together (one batched generate per agent and turn) per update. 2
    gives twice the optimizer steps of 4 for the same samples, which learned more in the
    defaults' seed runs; 4 or more make larger generate batches, cheaper per completion on
    CPUs (benchmarks/vs_comlrl.py), for tasks with many items."""
    ppo_clip_range: float | None = 0.2
    """PPO's clip of the ratio to the policy that sampled, on rounds of several optimizer steps
    (``train_batch_size < rollout_buffer_size`` or ``ppo_epochs > 1``): the later steps train
    on samples of a policy that has moved since. A round of one step is on-policy and needs
    none (None: refuse rounds of several steps)."""
    ppo_epochs: int = 1
    """Passes over each round's rows (TRL's ``num_iterations``): every window of
    ``train_batch_size`` items is stepped on this many times, the later steps with PPO's clipped
    ratio (so > 1 needs ``ppo_clip_range``). The first step's pass gives the rows' old
    log-probs, so a round of one window pays no scoring pass for them. 1: why, in
    docs/experiments.md ("Why the MAGRPO defaults")."""
    reference_kl_enabled: bool = False
    """Penalise divergence from the agents' initial weights (``reference_kl_coef`` times the k3
    KL estimate in the loss). Off by default, as in comlrl: on the seed's program it learned
    more in one epoch over six seeds but ended the main job's six epochs lower, and it costs a
    no-gradient reference forward per update and, with full fine-tuning, one frozen copy per
    distinct initial model (adapter agents use their base with adapters off); measurements in
    docs/experiments.md."""
    reference_kl_coef: float = 0.1
    mask_truncated_completions: bool = False
    """Leave completions cut at ``max_new_tokens`` (no EOS) out of the loss, as TRL's option of
    that name: their rewards still count in their groups' baselines and std, but their
    tokens get no gradient, so an answer the cap cut short is not pushed up or down."""
    prefix_sharing: bool = True
    """Score the G completions of a prompt over one forward of the prompt (its KV cache serves
    them, gradients included): the same log-probs and gradients to float rounding, fewer
    FLOPs (benchmarks/prefix_scoring.py; cmlrl_agents/policies/prefix_scoring.py). Models
    whose cache holds more than attention keys and values (LFM2, Mamba) score unshared."""
    log_train_levels: bool = False
    """Also give each round's training completions to ``eval_logger`` and log the means of its
    rows' ``turn_k/...`` values as training metrics (e.g. ``turn_1/level/<name>``, each level
    of a paper reward), so a collapse shows which level moved. It scores the round's answers
    once more (for code: runs their tests again)."""
    tree_plot_interval: int = 0
    """Every N-th round (the 1st, the N+1-th, ...) draw the first item's rollout tree into
    ``output_dir/trees/env_step-<E>.png`` with ``.html`` (full texts) and ``.json`` (0: never)."""
    eval_interval: int = 16
    logging_steps: int = 50

    def validate(self) -> None:
        super().validate()
        self._int("num_generations", 1)
        self._choice("joint_mode", JOINT_MODES)
        self._choice("advantage_mode", ADVANTAGE_MODES)
        scale = self.advantage_normalization
        if not isinstance(scale, bool) and scale not in ADVANTAGE_SCALES:
            raise ValueError(
                f"advantage_normalization must be True, False or one of {list(ADVANTAGE_SCALES)} "
                f"(TRL's scale_rewards), got {scale!r}."
            )
        self._choice("loss_aggregation", LOSS_AGGREGATIONS)
        self._bool("reference_kl_enabled")
        self._real("reference_kl_coef", 0.0)
        self._bool("prefix_sharing")
        self._bool("mask_truncated_completions")
        self._int("tree_plot_interval", 0)
        self._bool("log_train_levels")
        self._real("ppo_clip_range", 0.0, low_open=True, optional=True)
        self._int("ppo_epochs", 1)
        self._check_stale_rounds(self.ppo_clip_range, "optimizer steps", self.ppo_epochs)
        if self.advantage_mode == "raw" and self.advantage_normalization not in (False, "none"):
            raise ValueError(
                f"advantage_mode='raw' with advantage_normalization="
                f"{self.advantage_normalization!r}: raw returns have no "
                "baseline, so dividing them by their siblings' std amplifies equal returns "
                "(std 0: a reward of 0.7 becomes an advantage of 7e5). Set "
                "advantage_normalization=False (as MAREINFORCEConfig does) or use a baseline "
                "(advantage_mode='mean', 'rloo' or 'max')."
            )
        if self.num_generations < 2 and self.advantage_mode != "raw":
            raise ValueError(
                f"num_generations={self.num_generations} with advantage_mode="
                f"{self.advantage_mode!r}: a group baseline needs at least 2 samples per state; "
                "use num_generations >= 2, or advantage_mode='raw' with "
                "advantage_normalization=False (plain REINFORCE, MAREINFORCEConfig)."
            )


@dataclass
class MAREINFORCEConfig(MAGRPOConfig):
    """Plain multi-agent REINFORCE: raw returns, no baseline, no scaling."""

    advantage_mode: str = "raw"
    advantage_normalization: bool = False


@dataclass
class MAReMaxConfig(MAGRPOConfig):
    """ReMax-style: the best sibling's return as the baseline."""

    advantage_mode: str = "max"
    advantage_normalization: bool = False


@dataclass
class MARLOOConfig(MAGRPOConfig):
    """RLOO: the mean of the other siblings' returns as the baseline."""

    advantage_mode: str = "rloo"
    advantage_normalization: bool = False
