"""``IACConfig`` and ``MAACConfig``: the actor-critic trainers' validated settings.

Defaults follow the reference (comlrl 1.4.3, research notes §1.4-§1.5) where that is sensible, and
differ where it is not: one turn by default (the reference's two turns raise without a
transition), one training epoch, value clipping off, GAE over turns instead of the reference's
fixed TD(0) target (``gae_lambda=0.0`` reproduces it), and a PPO-clipped ratio as an opt-in.
"""

from __future__ import annotations

from dataclasses import dataclass

from cmlrl_agents.foundation.config import SharedConfig

__all__ = ["ActorCriticConfig", "IACConfig", "MAACConfig", "check_chain_turns"]


def check_chain_turns(num_turns: int, num_generations: int) -> None:
    """Actor-critic rounds are chains: several samples per turn only in one-turn tasks."""
    if num_turns > 1 and num_generations > 1:
        raise ValueError(
            f"num_generations={num_generations} with num_turns={num_turns}: "
            "actor-critic training follows one chain of turns per task item, and with "
            "several samples per turn a turn-1 sample would head a tree of chains (each turn "
            "multiplying them). Use num_generations=1 for multi-turn, or MAGRPOTrainer, "
            "which trains on the tree."
        )


CRITIC_TYPES = ("v",)


@dataclass
class ActorCriticConfig(SharedConfig):
    """Fields IAC and MAAC share (use :class:`IACConfig` or :class:`MAACConfig`)."""

    num_generations: int = 1
    """Completions per agent per state in training (single turn only when > 1)."""
    critic_learning_rate: float | None = None
    """AdamW learning rate of the critics (None: ``agent_learning_rate``)."""
    value_loss_coef: float = 0.5
    """Weight of the critic's MSE. With a head on the actor it balances the two losses on the
    shared trunk; with a separate critic it only rescales that critic's gradient."""
    value_clip_range: float | None = None
    """Clip each value update to within this of the rollout-time value (None: plain MSE)."""
    # The seed's and comlrl's name, kept because users set it; here a z-score, in the MAGRPO
    # family std scaling without re-centring (see MAGRPOConfig).
    advantage_normalization: bool = True
    """Z-score each agent's advantages over the round's samples."""
    gae_lambda: float = 0.95
    """GAE's lambda over turns: 0 is the TD(0) target r + discount·V(s'), 1 the Monte-Carlo
    return; irrelevant with one turn."""
    ppo_clip_range: float | None = None
    """None: one plain policy-gradient step per round (REINFORCE with the critic as baseline);
    a float: PPO's clipped ratio against the rollout-time log-probs, needed when a round takes
    several steps (``ppo_epochs > 1`` or ``train_batch_size < rollout_buffer_size``)."""
    ppo_epochs: int = 1
    """Passes over each round's samples (TRL's ``num_iterations``); > 1 needs
    ``ppo_clip_range``."""
    rollout_buffer_size: int = 8
    """Task items per round, as in the reference (whose buffer held 8 single-turn samples):
    advantages are normalised over a round, which needs more than one or two samples."""
    value_head_hidden_dim: int | None = None
    """None: a linear value head; an int: a tanh MLP of that width."""
    reference_kl_enabled: bool = False
    """Penalise each actor's divergence from a frozen copy of its initial weights (a
    ``reference_kl_coef`` · KL loss term, as in the MAGRPO family)."""
    reference_kl_coef: float = 0.1
    critic_devices: str | list[str] | None = None
    """Where separate critics live (one per critic, or one for all; "auto" as for
    ``agent_devices``). None: beside the agent each critic serves."""
    top_k: int | None = None
    eval_interval: int = 16
    logging_steps: int = 1

    def validate(self) -> None:
        super().validate()
        self._int("num_generations", 1)
        self._real("critic_learning_rate", 0.0, low_open=True, optional=True)
        self._real("value_loss_coef", 0.0, low_open=True)
        self._real("value_clip_range", 0.0, low_open=True, optional=True)
        self._bool("advantage_normalization")
        self._real("gae_lambda", 0.0, 1.0)
        self._real("ppo_clip_range", 0.0, low_open=True, optional=True)
        self._int("ppo_epochs", 1)
        self._int("value_head_hidden_dim", 1, optional=True)
        self._bool("reference_kl_enabled")
        self._real("reference_kl_coef", 0.0)
        self._devices("critic_devices")
        self._check_combinations()

    def _check_combinations(self) -> None:
        if self.num_turns is not None:  # else the trainer checks the task's turns
            check_chain_turns(self.num_turns, self.num_generations)
        self._check_stale_rounds(self.ppo_clip_range, "minibatch steps", self.ppo_epochs)
        if self.advantage_normalization and self.rollout_buffer_size * self.num_generations < 2:
            raise ValueError(
                f"advantage_normalization=True with rollout_buffer_size="
                f"{self.rollout_buffer_size} and num_generations={self.num_generations}: a "
                "single-turn round would hold one sample per agent, whose z-scored advantage is "
                "always 0 (no learning). Raise rollout_buffer_size or set "
                "advantage_normalization=False."
            )

    @property
    def critic_lr(self) -> float:
        return (
            self.critic_learning_rate
            if self.critic_learning_rate is not None
            else self.agent_learning_rate
        )


@dataclass
class IACConfig(ActorCriticConfig):
    """Independent actor-critic: each agent has its own critic ``V_i(prompt_i)``."""

    use_separate_critic: bool = True
    """True: one separate critic LM per agent (pass ``critic_model=`` or ``critics=``);
    False: a value head on each actor's own trunk, trained through the actor's optimizer."""
    critic_type: str = "v"
    """Only "v" (state value): see validate() for why "q" is refused."""

    def validate(self) -> None:
        super().validate()
        self._bool("use_separate_critic")
        _check_critic_type(self.critic_type)


@dataclass
class MAACConfig(ActorCriticConfig):
    """Multi-agent actor-critic: one centralised critic ``V(joint transcript)`` for the team."""

    critic_type: str = "v"
    """Only "v" (state value): see validate() for why "q" is refused."""

    def validate(self) -> None:
        super().validate()
        _check_critic_type(self.critic_type)


def _check_critic_type(value: object) -> None:
    if value == "q":
        raise ValueError(
            "critic_type='q' is not supported: a baseline that depends on the sampled action, "
            "Q(s, a), biases the policy gradient (E[grad log pi(a|s) * Q(s, a)] is not 0), which "
            "is the reference's bug B14. Use critic_type='v', whose V(s) baseline is unbiased."
        )
    if value not in CRITIC_TYPES:
        raise ValueError(f"critic_type must be one of {list(CRITIC_TYPES)}, got {value!r}.")
