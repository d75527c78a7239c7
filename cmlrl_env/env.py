"""``CoMLRLEnv``: task sets, formatters, rewards and transitions as a PettingZoo ``ParallelEnv``.

| | |
|---|---|
| Agents | ``agent_0 … agent_{n-1}`` in actor order (n from the formatters or ``num_agents``) |
| Observation | the agent's prompt (``str``; ``{"prompt": str}`` with ``dict_observations=True``) |
| Action | the agent's completion (``str``, at most ``max_completion_chars`` characters) |
| Reward | cooperative: every agent gets the joint response's (processed) reward |
| Termination | ``terminated`` after the last of ``num_turns`` turns, or earlier when the turn's |
| | reward exceeds ``early_termination_threshold``; never ``truncated`` (no limit of its own) |
| Infos | ``turn`` (int), ``item_index`` (int, ``-1`` for a given item), ``raw_reward`` (float, |
| | ``0.0`` at reset): the same keys and types at reset and every step |
| Item order | ``item_order="dataset"`` (from item ``seed % len``) or ``"shuffle"`` |
| State | the joint transcript of the episode (for centralised critics) |

Version history: v1 — a seed restarts the item order; the task's end is a termination; stable
infos; unknown reset options raise (except in a call from PettingZoo's test utilities, which probe
the signature: ``PROBING_PACKAGE``). v0 — first release.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from datasets import Dataset, IterableDataset
from gymnasium import spaces
from pettingzoo import ParallelEnv

from cmlrl_env.core import DEFAULT_EARLY_TERMINATION_THRESHOLD, EpisodeState, Outcome
from cmlrl_env.dataset import check_seed
from cmlrl_env.formatters import Formatter
from cmlrl_env.rewards import RewardProcessor
from cmlrl_env.spaces import DEFAULT_MAX_CHARS, TextSpace
from cmlrl_env.task_spec import TaskSpec

__all__ = ["CoMLRLEnv", "GIVEN_ITEM_INDEX", "PROBING_PACKAGE", "RESET_OPTIONS"]

Obs = Any  # str, or {"prompt": str} with dict_observations=True

GIVEN_ITEM_INDEX = -1  # infos["item_index"] of an item given through options={"item": ...}
RESET_OPTIONS = ("index", "item")
PROBING_PACKAGE = "pettingzoo.test"
"""Reset options that ``RESET_OPTIONS`` does not know raise, except in a call made by this
package: PettingZoo's own test utilities (``parallel_api_test``, ``api_test``) pass a placeholder
(``{"options": 1}`` today) only to check that ``reset`` takes the ``options`` keyword, so from
there any options that are not ours are ignored, whatever a future version sends."""


class CoMLRLEnv(ParallelEnv[str, Obs, str]):
    """Observations are prompts, actions are completions, rewards are cooperative.

    ``env = CoMLRLEnv(dataset, formatters, reward_func)``; ``reset(seed=s)`` restarts the item
    order from ``s`` and each ``reset()`` takes the next item of it (``item_order``, see
    ``cmlrl_env.dataset``); ``options={"index": i}`` pins item ``i`` of a map-style dataset and
    ``options={"item": {...}}`` plays a given item, neither moving the order.

    Trainers use the same env without ``reset``/``step``: ``epoch_items`` reads the dataset in
    its order, ``initial_state(item)`` starts a branch and ``step_group(states, joint_actions)``
    plays many joint actions of one item at once (one reward call). Both apply the env's checks
    (``max_prompt_chars``, ``max_completion_chars``, completion types) and then delegate to the
    pure core ``env.task`` (``Task.initial_state``, ``Task.step_group``), so the plain loop and
    training share one code path and one set of errors.
    """

    # render_fps is nominal: "human" prints the transcript once per step.
    metadata = {
        "name": "comlrl_v1",
        "render_modes": ["ansi", "human"],
        "render_fps": 1,
        "is_parallelizable": True,
    }

    def __init__(
        self,
        dataset: Dataset | IterableDataset,
        formatters: Formatter | Sequence[Formatter] | None = None,
        reward_func: Callable[..., Any] | None = None,
        *,
        num_agents: int | None = None,
        num_turns: int = 1,
        external_transition: Callable[..., Any] | None = None,
        reward_processor: RewardProcessor | None = None,
        early_termination_threshold: float | None = DEFAULT_EARLY_TERMINATION_THRESHOLD,
        render_mode: str | None = None,
        max_prompt_chars: int = DEFAULT_MAX_CHARS,
        max_completion_chars: int = DEFAULT_MAX_CHARS,
        dict_observations: bool = False,
        item_order: str = "dataset",
    ) -> None:
        if reward_func is None:
            raise TypeError(
                "CoMLRLEnv needs reward_func: CoMLRLEnv(dataset, formatters, reward_func)."
            )
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(
                f"render_mode={render_mode!r} is not supported; choose one of "
                f"{self.metadata['render_modes']} or None."
            )
        self.spec = TaskSpec(
            dataset,
            formatters,
            reward_func,
            reward_processor=reward_processor,
            external_transition=external_transition,
            num_agents=num_agents,
            num_turns=num_turns,
            early_termination_threshold=early_termination_threshold,
            max_prompt_chars=max_prompt_chars,
            max_completion_chars=max_completion_chars,
            item_order=item_order,
        )
        """The validated task this env plays (``CoMLRLEnv.from_spec`` builds an env from one)."""
        self.source = self.spec.source()
        self.task = self.spec.task()
        self.render_mode = render_mode
        self.dict_observations = dict_observations
        self.possible_agents = [f"agent_{i}" for i in range(self.task.num_agents)]
        self.agents: list[str] = []
        # One space object per agent: seeding agent_1's space must not reseed agent_0's.
        self.max_prompt_chars = max_prompt_chars
        self._obs_spaces = {
            a: spaces.Dict({"prompt": TextSpace(max_prompt_chars)})
            if dict_observations
            else TextSpace(max_prompt_chars)
            for a in self.possible_agents
        }
        self._act_spaces = {a: TextSpace(max_completion_chars) for a in self.possible_agents}
        per_turn = max_prompt_chars + max_completion_chars + 64
        self.state_space = TextSpace(self.task.num_agents * num_turns * per_turn)
        self.np_random = np.random.default_rng()
        self._state: EpisodeState | None = None
        self._last: tuple[tuple[str, ...], Outcome] | None = None

    # -- spaces ---------------------------------------------------------------------------------
    @classmethod
    def from_spec(
        cls, spec: TaskSpec, *, render_mode: str | None = None, dict_observations: bool = False
    ) -> CoMLRLEnv:
        """The env over a ``TaskSpec`` (with the env's own display options)."""
        if not isinstance(spec, TaskSpec):
            raise TypeError(f"spec must be a cmlrl_env.TaskSpec, got {type(spec).__name__}.")
        fields = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
        return cls(**fields, render_mode=render_mode, dict_observations=dict_observations)

    def observation_space(self, agent: str) -> spaces.Space[Any]:
        return self._obs_spaces[agent]

    def action_space(self, agent: str) -> spaces.Space[Any]:
        return self._act_spaces[agent]

    # -- episode --------------------------------------------------------------------------------
    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Obs], dict[str, dict[str, Any]]]:
        """Start an episode on the next task item (or the one ``options`` pins).

        A seed reseeds ``np_random`` and restarts the item order; no seed continues it.
        """
        seed = check_seed(seed)
        options = _check_options(options)
        if seed is not None:
            self.np_random = np.random.default_rng(seed)
            self.source.rewind(seed)
        item, index = self._pick_item(options)
        self._state = self.initial_state(item, index)
        self._last = None
        self.agents = list(self.possible_agents)
        return self._observe(self._state), self._infos(self._state, None)

    def _pick_item(self, options: dict[str, Any]) -> tuple[dict[str, Any], int | None]:
        if "index" in options and "item" in options:
            raise ValueError("reset options take 'index' or 'item', not both.")
        if "index" in options:
            return self.source.get(options["index"]), options["index"]
        if "item" in options:
            if not isinstance(options["item"], dict):
                raise TypeError(
                    f"options['item'] must be a dict task item, got "
                    f"{type(options['item']).__name__}."
                )
            return dict(options["item"]), None
        return self.source.next()

    def step(
        self, actions: dict[str, str]
    ) -> tuple[
        dict[str, Obs],
        dict[str, float],
        dict[str, bool],
        dict[str, bool],
        dict[str, dict[str, Any]],
    ]:
        """Play one turn: every live agent's completion, one reward for the joint response."""
        state = self._require_live_state()
        joint = self._joint_action(actions)
        outcome = self.step_group([state], [[joint]])[0][0]
        agents = self.agents
        self._last = (joint, outcome)
        if outcome.next_state is not None:
            self._state = outcome.next_state
        else:
            self._state = dataclasses.replace(
                state,
                turns_played=state.turns_played + 1,
                response_history=tuple(
                    h + (a,) for h, a in zip(state.response_history, joint, strict=True)
                ),
            )
            self.agents = []
        obs = self._observe(self._state)
        rewards = {a: outcome.reward for a in agents}
        terms = {a: outcome.terminated for a in agents}
        truncs = {a: False for a in agents}  # the task has no limit of its own; wrappers add them
        infos = self._infos(self._state, outcome)
        if self.render_mode == "human":
            self.render()
        return obs, rewards, terms, truncs, infos

    def _require_live_state(self) -> EpisodeState:
        if self._state is None:
            raise RuntimeError("step() was called before reset(); call env.reset() first.")
        if not self.agents:
            raise RuntimeError(
                "step() was called after the episode ended (env.agents is empty); "
                "call env.reset() to start the next episode."
            )
        return self._state

    def _joint_action(self, actions: dict[str, str]) -> tuple[str, ...]:
        if not isinstance(actions, dict):
            raise TypeError(
                f"actions must be a dict {{agent: completion}}, got {type(actions).__name__}."
            )
        unknown = sorted(set(actions) - set(self.agents))
        missing = [a for a in self.agents if a not in actions]
        if unknown or missing:
            raise KeyError(
                f"actions must hold exactly the live agents {self.agents}; unknown: "
                f"{unknown}, missing: {missing}."
            )
        return tuple(actions[a] for a in self.agents)  # types and lengths: step_group

    # -- the group step (trainers) ----------------------------------------------------------------
    @property
    def num_turns(self) -> int:
        """The turns of one episode (``spec.num_turns``)."""
        return self.spec.num_turns

    def epoch_items(
        self, epoch: int | None = 1, start: int = 0, limit: int | None = None, *, name: str = ""
    ) -> Iterator[tuple[int, dict[str, Any]]]:
        """``(index, item)`` of one epoch in dataset order from ``start`` (to ``limit``), what
        trainers train and evaluate on (``TaskSource.epoch_items``); the ``reset`` order does
        not move. ``name`` names the dataset in errors (e.g. ``"train_dataset"``)."""
        return self.source.epoch_items(epoch, start, limit, name=name or None)

    def initial_state(self, item: Mapping[str, Any], item_index: int | None = None) -> EpisodeState:
        """The first state of an episode on ``item`` (what ``reset`` starts), its prompts
        checked against ``max_prompt_chars``."""
        state = self.task.initial_state(item, item_index)
        self._check_prompts(state)
        return state

    def step_group(
        self, states: Sequence[EpisodeState], joint_actions: Sequence[Sequence[Sequence[str]]]
    ) -> list[list[Outcome]]:
        """Play ``joint_actions[b][j]`` (one completion per agent, actor order) from
        ``states[b]``, all branches of one task item, with one reward call; ``outcomes[b][j]``.

        ``step`` is ``step_group([state], [[joint_action]])``: the completions are checked
        (str, at most ``max_completion_chars``) and every next state's prompts against
        ``max_prompt_chars``, with the same errors as the plain loop.
        """
        for acts in joint_actions:
            for action in acts:
                if isinstance(action, str):
                    continue  # Task.step_group names the malformed joint action
                for agent, text in zip(self.possible_agents, action, strict=False):
                    self._check_completion(agent, text)
        outcomes = self.task.step_group(states, joint_actions)
        for row in outcomes:
            for outcome in row:
                if outcome.next_state is not None:
                    self._check_prompts(outcome.next_state)
        return outcomes

    def _check_completion(self, agent: str, text: object) -> None:
        if not isinstance(text, str):
            raise TypeError(
                f"the action of {agent} must be a completion str, got "
                f"{type(text).__name__} {text!r:.80}."
            )
        if not self._act_spaces[agent].contains(text):
            raise ValueError(
                f"the action of {agent} has {len(text)} characters, more than "
                f"max_completion_chars={self._act_spaces[agent].max_length}."
            )

    def _check_prompts(self, state: EpisodeState) -> None:
        limit = self.max_prompt_chars
        for agent, prompt in zip(self.possible_agents, state.prompts, strict=True):
            if len(prompt) > limit:
                raise ValueError(
                    f"the prompt of {agent} at turn {state.turns_played + 1} of item "
                    f"{state.item_index} has {len(prompt)} characters, more than "
                    f"max_prompt_chars={limit}; raise max_prompt_chars or shorten the "
                    "formatter's or transition's prompt."
                )

    def _observe(self, state: EpisodeState) -> dict[str, Obs]:
        return {
            a: {"prompt": p} if self.dict_observations else p
            for a, p in zip(self.possible_agents, state.prompts, strict=True)
        }

    def _infos(self, state: EpisodeState, outcome: Outcome | None) -> dict[str, dict[str, Any]]:
        # The same keys and types at reset and every step: consumers such as TorchRL build their
        # info spec from the reset infos.
        info = {
            "turn": state.turns_played,  # infos["turn"]: the turns played (v1 contract)
            "item_index": GIVEN_ITEM_INDEX if state.item_index is None else state.item_index,
            "raw_reward": 0.0 if outcome is None else float(outcome.raw_reward),
        }
        return {a: dict(info) for a in self.possible_agents}

    # -- views ----------------------------------------------------------------------------------
    # PettingZoo declares an array; the state of a text task is its transcript.
    def state(self) -> str:  # type: ignore[override]
        """The joint transcript of the current episode (every agent's prompts and responses)."""
        if self._state is None:
            raise RuntimeError("state() was called before reset(); call env.reset() first.")
        return self._state.transcript()

    def render(self) -> str | None:
        if self.render_mode is None:
            return None
        text = self._render_text()
        if self.render_mode == "human":
            print(text)
            return None
        return text

    def _render_text(self) -> str:
        if self._state is None:
            return "(not reset)"
        index = -1 if self._state.item_index is None else self._state.item_index  # as infos
        header = f"item {index} · turn {self._state.turns_played}/{self.num_turns}"
        if self._last is not None:
            joint, outcome = self._last
            header += f" · reward {outcome.reward:.4g}"
        return header + "\n" + self._state.transcript()

    def close(self) -> None:
        self._state = None
        self.agents = []


def _called_by_pettingzoo_tests() -> bool:
    """Whether a function of ``PROBING_PACKAGE`` is on the call stack (searched only when the
    options are wrong, so a correct call pays nothing)."""
    frame = inspect.currentframe()
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module == PROBING_PACKAGE or module.startswith(PROBING_PACKAGE + "."):
            return True
        frame = frame.f_back
    return False


def _check_options(options: object) -> dict[str, Any]:
    if options is None:
        return {}
    known = isinstance(options, dict) and all(k in RESET_OPTIONS for k in options)
    if not known and _called_by_pettingzoo_tests():
        return {}  # a signature probe (see PROBING_PACKAGE)
    if not isinstance(options, dict):
        raise TypeError(
            f"options must be None or a dict with the keys {list(RESET_OPTIONS)}, got "
            f"{type(options).__name__} {options!r:.80}; e.g. options={{'index': 0}}."
        )
    unknown = sorted(str(k) for k in options if k not in RESET_OPTIONS)
    if unknown:
        raise ValueError(
            f"unknown reset option(s) {unknown}; the valid keys are {list(RESET_OPTIONS)} "
            "('index': an item of a map-style dataset, 'item': a task item dict)."
        )
    return options
