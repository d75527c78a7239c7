"""The pure core of the environment: frozen episode states and one group step.

The trainers sample G joint responses from the *same* state and, over several turns, expand every
branch into G children. That needs states that can be kept side by side, so the episode lives in
an immutable ``EpisodeState`` and ``Task.step_group`` maps states and joint actions to outcomes.
``CoMLRLEnv.step`` is a group step of one branch and one joint action, so the plain loop and the
trainers' tree share a single code path.
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cmlrl_env.formatters import Formatter, Formatters
from cmlrl_env.rewards import RewardFunction, RewardProcessor, apply_processor
from cmlrl_env.transitions import Transition

__all__ = ["EpisodeState", "MAX_AGENTS", "Outcome", "Task", "DEFAULT_EARLY_TERMINATION_THRESHOLD"]

# Seed semantics (SPEC §6): a branch ends early when its reward exceeds the threshold. The
# default ends every branch after turn 1 for non-negative rewards; it is kept, and warned about.
DEFAULT_EARLY_TERMINATION_THRESHOLD = -0.2

MAX_AGENTS = 10_000
"""The largest team an env accepts. Every agent answers at every turn: the env calls its
formatter, checks its completion and gives the reward one list per agent at each step, and an LLM
agent holds weights (or an adapter) and an optimizer state of its own. A larger count is almost
always a mistake (a dataset size or a token count given as ``num_agents``), and it is refused when
the env or trainer is built rather than found out by memory or time (the env alone holds under
1 KB per agent before any reset)."""


@dataclass(frozen=True)
class EpisodeState:
    """One branch of an episode before its next turn.

    ``turns_played`` counts the turns already played (0 before the first), so the turn about to
    be played is ``turns_played + 1``: every turn *number* in this project (``Level.turn``,
    ``Sample.turn``, the metric names ``turn_k/...``) is 1-based, and this count is not one.
    ``prompt_history[agent]`` holds the prompts shown so far including the current one;
    ``response_history[agent]`` the completions given (one fewer).
    """

    item: Mapping[str, Any]
    item_index: int | None
    turns_played: int
    prompts: tuple[str, ...]
    prompt_history: tuple[tuple[str, ...], ...]
    response_history: tuple[tuple[str, ...], ...]

    def transcript(self) -> str:
        """The joint transcript so far, agent by agent and turn by turn (``env.state()``)."""
        blocks = []
        for agent, (prompts, responses) in enumerate(
            zip(self.prompt_history, self.response_history, strict=True)
        ):
            for turn, prompt in enumerate(prompts):
                blocks.append(f"[agent_{agent} turn {turn + 1} prompt]\n{prompt}")
                if turn < len(responses):
                    blocks.append(f"[agent_{agent} turn {turn + 1} response]\n{responses[turn]}")
        return "\n\n".join(blocks)


@dataclass(frozen=True)
class Outcome:
    """What one joint action did to one branch.

    ``terminated`` means the task is over for this branch: its last turn was played (the reward
    scored the final answer) or its reward exceeded ``early_termination_threshold``. Either way
    nothing follows, so no value should be bootstrapped. The task has no limits of its own that
    would cut an episode short (truncation); those belong to wrappers such as ``TimeLimit``.
    """

    reward: float
    raw_reward: float
    terminated: bool
    next_state: EpisodeState | None

    @property
    def done(self) -> bool:
        return self.terminated


class Task:
    """Formatters, reward, reward processor and transition bound to a team of ``num_agents``."""

    def __init__(
        self,
        formatters: Formatter | Sequence[Formatter] | None,
        reward_func: Callable[..., Any],
        *,
        num_agents: int | None = None,
        num_turns: int = 1,
        external_transition: Callable[..., Any] | None = None,
        reward_processor: RewardProcessor | None = None,
        early_termination_threshold: float | None = DEFAULT_EARLY_TERMINATION_THRESHOLD,
    ) -> None:
        self.num_agents = _resolve_num_agents(formatters, num_agents)
        if isinstance(num_turns, bool) or not isinstance(num_turns, int) or num_turns < 1:
            raise ValueError(f"num_turns must be an int >= 1, got {num_turns!r}.")
        if num_turns > 1 and external_transition is None:
            raise ValueError(
                f"num_turns={num_turns} needs external_transition to build the prompts of turns "
                "2 and later; pass external_transition=f(prompt, agent_completions, num_agents, "
                "**history) or use num_turns=1."
            )
        if reward_processor is not None and not callable(reward_processor):
            raise TypeError(
                f"reward_processor must be callable float -> float, got {reward_processor!r}."
            )
        _check_threshold(early_termination_threshold)
        self.num_turns = num_turns
        self.formatters = Formatters(formatters, self.num_agents)
        self.reward = RewardFunction(reward_func, self.num_agents)
        self.transition = (
            Transition(external_transition, self.num_agents)
            if external_transition is not None
            else None
        )
        self.reward_processor = reward_processor
        self.early_termination_threshold = early_termination_threshold
        self._warned_collapse = False

    def initial_state(self, item: Mapping[str, Any], item_index: int | None = None) -> EpisodeState:
        if not isinstance(item, Mapping):
            raise TypeError(
                f"a task item must be a mapping (a dataset row), got {type(item).__name__}."
            )
        prompts = tuple(
            self.formatters.format(a, item, item_index=item_index) for a in range(self.num_agents)
        )
        return EpisodeState(
            item=item,
            item_index=item_index,
            turns_played=0,
            prompts=prompts,
            prompt_history=tuple((p,) for p in prompts),
            response_history=((),) * self.num_agents,
        )

    def step_group(
        self, states: Sequence[EpisodeState], joint_actions: Sequence[Sequence[Sequence[str]]]
    ) -> list[list[Outcome]]:
        """Play ``joint_actions[b][j]`` (one completion per agent) from ``states[b]``.

        All states are branches of one task item; one ``reward_func`` call scores every joint
        action. Returns ``outcomes[b][j]``.
        """
        self._check_group(states, joint_actions)
        flat = [tuple(a) for acts in joint_actions for a in acts]
        item, index = states[0].item, states[0].item_index
        raw = self.reward(
            [[a[agent] for a in flat] for agent in range(self.num_agents)], item, item_index=index
        )
        rewards = (
            apply_processor(self.reward_processor, raw, repr(self.reward_processor))
            if self.reward_processor is not None
            else raw
        )
        outcomes: list[list[Outcome]] = []
        k = 0
        for state, acts in zip(states, joint_actions, strict=True):
            row = []
            for action in acts:
                row.append(self._outcome(state, tuple(action), rewards[k], raw[k]))
                k += 1
            outcomes.append(row)
        self._warn_if_collapsed(states, outcomes)
        return outcomes

    def _outcome(
        self, state: EpisodeState, action: tuple[str, ...], reward: float, raw: float
    ) -> Outcome:
        threshold = self.early_termination_threshold
        last_turn = state.turns_played + 1 >= self.num_turns
        terminated = last_turn or (threshold is not None and reward > threshold)
        next_state = None if terminated else self._advance(state, action)
        return Outcome(reward, raw, terminated, next_state)

    def _advance(self, state: EpisodeState, action: tuple[str, ...]) -> EpisodeState:
        assert self.transition is not None  # num_turns > 1 requires one (checked in __init__)
        responses = tuple(h + (a,) for h, a in zip(state.response_history, action, strict=True))
        external = self.transition(
            state.item,
            action,
            prompt_history=state.prompt_history,
            response_history=responses,
            item_index=state.item_index,
        )
        prompts = tuple(
            self.formatters.format(
                a, state.item, item_index=state.item_index, external_prompt=external[a]
            )
            for a in range(self.num_agents)
        )
        return EpisodeState(
            item=state.item,
            item_index=state.item_index,
            turns_played=state.turns_played + 1,
            prompts=prompts,
            prompt_history=tuple(
                h + (p,) for h, p in zip(state.prompt_history, prompts, strict=True)
            ),
            response_history=responses,
        )

    def _check_group(
        self, states: Sequence[EpisodeState], joint_actions: Sequence[Sequence[Sequence[str]]]
    ) -> None:
        if not states or len(states) != len(joint_actions):
            raise ValueError(
                f"step_group needs one list of joint actions per state; got "
                f"{len(states)} state(s) and {len(joint_actions)} list(s)."
            )
        first = states[0]
        for b, (state, acts) in enumerate(zip(states, joint_actions, strict=True)):
            # Compare the items themselves: indices are None for items given via options.
            if state.item is not first.item and state.item != first.item:
                raise ValueError(
                    f"step_group scores branches of one task item per call, but "
                    f"states[{b}] holds item {state.item_index}, not "
                    f"{first.item_index}; call it once per item."
                )
            if state.turns_played >= self.num_turns:
                raise ValueError(f"states[{b}] already played all {self.num_turns} turn(s).")
            if not acts:
                raise ValueError(f"joint_actions[{b}] is empty; give at least one joint action.")
            for j, action in enumerate(acts):
                if isinstance(action, str) or len(action) != self.num_agents:
                    raise ValueError(
                        f"joint_actions[{b}][{j}] must hold one completion per agent "
                        f"({self.num_agents}), got {action!r:.80}."
                    )
                for agent, text in enumerate(action):
                    if not isinstance(text, str):
                        raise TypeError(
                            f"the action of agent_{agent} must be a completion str, "
                            f"got {type(text).__name__} {text!r:.80}."
                        )

    def _warn_if_collapsed(
        self, states: Sequence[EpisodeState], outcomes: list[list[Outcome]]
    ) -> None:
        if (
            self._warned_collapse
            or self.num_turns == 1
            or self.early_termination_threshold != DEFAULT_EARLY_TERMINATION_THRESHOLD
            or any(s.turns_played != 0 for s in states)
            or not all(o.terminated for row in outcomes for o in row)
        ):
            return
        self._warned_collapse = True
        warnings.warn(
            f"num_turns={self.num_turns}, but every branch ended after turn 1: each reward "
            f"exceeded the default early_termination_threshold={self.early_termination_threshold} "
            "(a branch ends early when its reward is above the threshold). Pass "
            "early_termination_threshold=None to always play every turn, or a threshold your "
            "rewards reach only when the answer is good enough (e.g. 0.9).",
            UserWarning,
            stacklevel=3,
        )


def _check_threshold(threshold: object) -> None:
    # Checked here: a str or NaN threshold would otherwise fail (or never fire) mid-rollout.
    if threshold is None:
        return
    if (
        isinstance(threshold, bool)
        or not isinstance(threshold, numbers.Real)
        or math.isnan(threshold)
    ):
        raise TypeError(
            f"early_termination_threshold must be a real number or None, got "
            f"{threshold!r}; e.g. 0.9 to end a branch once its reward exceeds 0.9."
        )


def _resolve_num_agents(formatters: object, num_agents: int | None) -> int:
    if num_agents is not None and (
        isinstance(num_agents, bool) or not isinstance(num_agents, int) or num_agents < 1
    ):
        raise ValueError(f"num_agents must be an int >= 1, got {num_agents!r}.")
    if isinstance(formatters, Sequence) and not isinstance(formatters, str):
        if num_agents is not None and num_agents != len(formatters):
            raise ValueError(
                f"num_agents={num_agents} but {len(formatters)} formatters were given; give one "
                "formatter per agent, or one shared callable with num_agents=N."
            )
        if len(formatters) == 0:
            raise ValueError("formatters is an empty list; give one formatter per agent.")
        num_agents = len(formatters)
    num_agents = 2 if num_agents is None else num_agents
    if num_agents > MAX_AGENTS:
        raise ValueError(
            f"num_agents={num_agents} is more than MAX_AGENTS={MAX_AGENTS}. Every agent answers "
            "at every turn (a formatter call, a completion and a reward argument each, and an "
            "LLM agent holds its own weights or adapter and optimizer state), so a team this "
            "large is almost always a mistake (a dataset size, a token count or num_generations "
            "given as num_agents). Give the team size: one formatter per agent, or num_agents=N."
        )
    return num_agents
