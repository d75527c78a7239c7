"""Conformance checks users run on their own task, like ``pettingzoo.test``.

Two entry points:

- ``check_env(env_fn)`` runs PettingZoo's own test suite on the env (``parallel_api_test``,
  ``parallel_seed_test``, ``render_test``, ``api_test``, ``state_test``) plus two checks of ours:
  multi-turn determinism over whole episodes and the text contract (prompts in their space,
  finite cooperative rewards, episodes end within ``num_turns``).
- ``check_task(dataset, formatters, reward_func, ...)`` (``cmlrl_env.task_check``) calls the
  formatters, reward and transition on sample items and sample completions, without a model and
  without an env, and explains every contract violation it finds.

PettingZoo's tests act with ``action_space(agent).sample()``: random printable strings of up to
``max_completion_chars`` characters, empty ones included. Reward functions and transitions must
cope with such garbage (return a low reward; never divide by a length without a guard).

Why ``api_test`` runs on ``dict_observations=True``: PettingZoo's AEC ``api_test`` asserts that
every observation has a ``dtype`` matching its space, and a bare ``str`` has none, so it fails on
the plain env with ``AttributeError: 'str' object has no attribute 'dtype'``. For a ``Dict``
observation space it inspects only an ``"observation"`` key, so ``{"prompt": str}`` passes.
"""

from __future__ import annotations

import contextlib
import io
import math
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from pettingzoo import ParallelEnv

from cmlrl_env._errors import describe_exception
from cmlrl_env.task_check import TaskCheckError, TaskReport, check_task

__all__ = [
    "ConformanceError",
    "TaskCheckError",
    "TaskReport",
    "check_env",
    "check_task",
    "check_multi_turn_determinism",
    "check_text_contract",
]

EnvFactory = Callable[..., ParallelEnv[Any, Any, Any]]

# PettingZoo's api_test and state_test warn about every non-numeric space; for a text env these
# say nothing about the task, so check_env silences exactly these and nothing else.
_TEXT_SPACE_WARNINGS = (
    r"Observation is not a NumPy array",
    r"State is not NumPy array",
    r"(Observation|Action|State) space for each (agent|environment) probably should be",
)

# Envs without a ``task`` (not a CoMLRLEnv) get this turn budget before the check gives up.
_MAX_TURNS_WITHOUT_TASK = 1000

_PURE_HINT = (
    "reward_func, the formatters and external_transition must depend only on their "
    "arguments (no global random state, counters or clocks); env_fn must build a fresh "
    "env, dataset order included, on every call"
)


class ConformanceError(AssertionError):
    """A check of ``check_env`` failed; ``check`` names it and the original error is chained."""

    def __init__(self, check: str, message: str) -> None:
        super().__init__(f"{check} failed: {message}")
        self.check = check


def _checks(
    env_fn: EnvFactory, num_cycles: int, num_episodes: int, seed: int
) -> list[tuple[str, Callable[[], Any], str]]:
    """``(name, run, hint)`` of every check, in the order ``check_env`` runs them."""
    # Imported here: pettingzoo.test imports pytest, which `import cmlrl_env` should not pay for.
    from pettingzoo.test import parallel_api_test, parallel_seed_test, state_test
    from pettingzoo.utils import parallel_to_aec

    return [
        ("parallel_api_test", lambda: _silently(parallel_api_test, env_fn(), num_cycles), ""),
        (
            "parallel_seed_test",
            lambda: _silently(parallel_seed_test, env_fn, num_cycles),
            _PURE_HINT,
        ),
        (
            "render_test",
            lambda: _render_test(env_fn),
            "env_fn is called as env_fn(render_mode=mode); forward keyword arguments to CoMLRLEnv",
        ),
        (
            "api_test(dict_observations=True)",
            lambda: _api_test(env_fn, num_cycles),
            "env_fn is called as env_fn(dict_observations=True); forward keyword arguments to "
            "CoMLRLEnv",
        ),
        (
            "state_test",
            lambda: _silently(state_test, parallel_to_aec(env_fn()), env_fn(), num_cycles),
            "",
        ),
        (
            "multi_turn_determinism",
            lambda: check_multi_turn_determinism(env_fn, num_episodes=num_episodes, seed=seed),
            "",
        ),
        (
            "text_contract",
            lambda: check_text_contract(env_fn, num_episodes=num_episodes, seed=seed),
            "",
        ),
    ]


def check_env(
    env_fn: EnvFactory, *, num_cycles: int = 10, num_episodes: int = 3, seed: int = 0
) -> tuple[str, ...]:
    """Run PettingZoo's test suite and our own checks on fresh envs from ``env_fn``.

    ``env_fn(**kwargs)`` must return a fresh ``CoMLRLEnv`` on every call. It is called with no
    arguments, with ``render_mode=...`` (``render_test``) and with ``dict_observations=True``
    (``api_test``), so forward keyword arguments, e.g.
    ``functools.partial(CoMLRLEnv, dataset, formatters, reward_func, num_turns=2, ...)``.

    For a multi-turn task pass ``early_termination_threshold=None`` (or a threshold random
    completions rarely reach) to the env, or every episode ends after turn 1 and the later turns
    go unchecked. The checks act with random printable completions (``action_space.sample()``,
    up to ``max_completion_chars`` characters, possibly empty); the task must cope with them.

    Returns the names of the checks that passed; raises ``ConformanceError`` (an
    ``AssertionError``) naming the first check that failed, with its cause chained.
    """
    _require_factory(env_fn)
    _require_count("num_cycles", num_cycles)
    _require_count("num_episodes", num_episodes)
    checks = _checks(env_fn, num_cycles, num_episodes, seed)
    passed = []
    for name, run, hint in checks:
        try:
            with _quiet_text_warnings():
                run()
        except ConformanceError:
            raise
        except Exception as exc:  # a checker or the user's task failed: name the check, chain it
            detail = describe_exception(exc)
            raise ConformanceError(name, detail + (f" (hint: {hint})" if hint else "")) from exc
        passed.append(name)
    return tuple(passed)


def check_multi_turn_determinism(
    env_fn: EnvFactory, *, num_episodes: int = 3, seed: int = 0
) -> None:
    """Two fresh envs, the same seed and the same actions: every turn of every episode matches.

    PettingZoo 1.27's ``parallel_seed_test`` compares only the first step, so a task whose
    second turn depends on hidden state (a random feedback, a call counter) passes it; this
    check compares observations, rewards, terminations, truncations, infos and ``state()`` after
    every turn of ``num_episodes`` consecutive episodes.
    """
    _require_factory(env_fn)
    env1, env2 = env_fn(), env_fn()
    sample = _action_sampler(env1, seed)
    for episode in range(num_episodes):
        episode_seed = seed if episode == 0 else None
        where = f"episode {episode}, reset"
        _same(
            where,
            "observations and infos",
            env1.reset(seed=episode_seed),
            env2.reset(seed=episode_seed),
        )
        turn = 0
        while env1.agents or env2.agents:
            turn += 1
            where = f"episode {episode}, turn {turn}"
            _same(where, "live agents", env1.agents, env2.agents)
            actions = sample(env1.agents)
            for field, a, b in zip(
                ("observations", "rewards", "terminations", "truncations", "infos"),
                env1.step(actions),
                env2.step(dict(actions)),
                strict=True,
            ):
                _same(where, field, a, b)
            _same(where, "state()", env1.state(), env2.state())
    env1.close()
    env2.close()


def check_text_contract(env_fn: EnvFactory, *, num_episodes: int = 3, seed: int = 0) -> None:
    """Observations in their spaces, finite cooperative float rewards, bounded episodes.

    A ``CoMLRLEnv`` also ends its episodes by termination only: after ``num_turns`` turns or
    early, never by truncation.
    """
    _require_factory(env_fn)
    env = env_fn()
    sample = _action_sampler(env, seed)
    max_turns = env.task.num_turns if hasattr(env, "task") else None
    for episode in range(num_episodes):
        obs, infos = env.reset(seed=seed if episode == 0 else None)
        _check_observations(env, obs, f"episode {episode}, reset")
        turn = 0
        while env.agents:
            turn += 1
            where = f"episode {episode}, turn {turn}"
            if turn > (max_turns or _MAX_TURNS_WITHOUT_TASK):
                raise ConformanceError("text_contract", f"{where}: the episode is still running.")
            live = list(env.agents)
            obs, rewards, terms, truncs, infos = env.step(sample(live))
            _check_observations(env, obs, where)
            _check_rewards(rewards, live, where)
            ended = {a for a in live if terms[a] or truncs[a]}
            if ended and ended != set(live):
                raise ConformanceError(
                    "text_contract",
                    f"{where}: agents {sorted(ended)} ended "
                    f"but {sorted(set(live) - ended)} did not; the team ends "
                    "an episode together.",
                )
            if max_turns is not None and turn == max_turns and not all(terms[a] for a in live):
                raise ConformanceError(
                    "text_contract",
                    f"{where}: terminations {terms} after the last of num_turns={max_turns} "
                    "turns; the task's end is a termination.",
                )
            if max_turns is not None and any(truncs[a] for a in live):
                raise ConformanceError(
                    "text_contract",
                    f"{where}: truncations {truncs}, but the task has no limit of its own "
                    "(its end, early or not, is a termination).",
                )
    env.close()


# -- helpers --------------------------------------------------------------------------------------
def _require_factory(env_fn: object) -> None:
    if isinstance(env_fn, ParallelEnv) or not callable(env_fn):
        raise TypeError(
            f"env_fn must be a function that builds a fresh env, got {type(env_fn).__name__}; "
            "pass e.g. functools.partial(CoMLRLEnv, dataset, formatters, reward_func), not an env."
        )


def _silently(test: Callable[..., Any], *args: Any) -> None:
    """Run one of PettingZoo's tests without its progress prints ("Passed API test", ...)."""
    with contextlib.redirect_stdout(io.StringIO()):
        test(*args)


def _require_count(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}.")


def _api_test(env_fn: EnvFactory, num_cycles: int) -> None:
    from pettingzoo.test import api_test
    from pettingzoo.utils import parallel_to_aec

    _silently(api_test, parallel_to_aec(env_fn(dict_observations=True)), num_cycles)


def _render_test(env_fn: EnvFactory) -> None:
    from pettingzoo.test import render_test
    from pettingzoo.utils import parallel_to_aec

    # "human" mode prints every transcript; _silently keeps the caller's output readable.
    _silently(
        render_test, lambda render_mode=None: parallel_to_aec(env_fn(render_mode=render_mode))
    )


@contextlib.contextmanager
def _quiet_text_warnings() -> Iterator[None]:
    with warnings.catch_warnings():
        for pattern in _TEXT_SPACE_WARNINGS:
            warnings.filterwarnings("ignore", message=pattern, category=UserWarning)
        yield


def _action_sampler(
    env: ParallelEnv[Any, Any, Any], seed: int
) -> Callable[[list[str]], dict[str, str]]:
    """Seeded random completions from the env's own action spaces, as PettingZoo's tests use."""
    for i, agent in enumerate(env.possible_agents):
        env.action_space(agent).seed(seed + i)
    return lambda agents: {a: env.action_space(a).sample() for a in agents}


def _same(where: str, field: str, a: Any, b: Any) -> None:
    from gymnasium.utils.env_checker import data_equivalence

    if not data_equivalence(a, b):
        raise ConformanceError(
            "multi_turn_determinism",
            f"{where}: {field} differ between two fresh envs given the same seed and actions:\n"
            f"  env 1: {a!r:.300}\n  env 2: {b!r:.300}\n{_PURE_HINT}.",
        )


def _check_observations(env: ParallelEnv[Any, Any, Any], obs: dict[str, Any], where: str) -> None:
    for agent in env.possible_agents:
        if agent not in obs:
            raise ConformanceError("text_contract", f"{where}: no observation for {agent}.")
        if not env.observation_space(agent).contains(obs[agent]):
            raise ConformanceError(
                "text_contract",
                f"{where}: the observation of {agent} ({type(obs[agent]).__name__}, "
                f"{obs[agent]!r:.80}) is outside {env.observation_space(agent)}; prompts must "
                "be str of at most max_prompt_chars characters (raise max_prompt_chars).",
            )


def _check_rewards(rewards: dict[str, Any], live: list[str], where: str) -> None:
    values = [rewards.get(a) for a in live]
    for agent, value in zip(live, values, strict=True):
        if not isinstance(value, float) or not math.isfinite(value):
            raise ConformanceError(
                "text_contract",
                f"{where}: the reward of {agent} is {value!r}; rewards must be finite floats.",
            )
    if len(set(values)) > 1:
        raise ConformanceError(
            "text_contract",
            f"{where}: rewards {rewards} differ between "
            "agents, but the task is cooperative (one reward per joint "
            "response).",
        )
