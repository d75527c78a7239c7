"""A single-agent Gymnasium view of a ``CoMLRLEnv``: one agent learns, the others are callables.

``as_gymnasium(env, agent="agent_0", partners={"agent_1": policy})`` returns a
``gymnasium.Env`` for single-agent libraries and for teaching. Each step, every partner answers
its own observation (``partner(observation) -> completion``), the learning agent's action joins
them, and the view returns that agent's observation, the cooperative reward and the env's
termination. Gymnasium's ``check_env`` passes on it and ``gymnasium.vector`` vectorises it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import gymnasium

from cmlrl_env.env import CoMLRLEnv, Obs

__all__ = ["GYMNASIUM_ID", "CoMLRLGymnasiumEnv", "as_gymnasium", "make_gymnasium_env"]

Partner = Callable[[Obs], str]


class CoMLRLGymnasiumEnv(gymnasium.Env):
    """``env`` seen by ``agent``; ``partners`` act for every other agent (see module doc)."""

    def __init__(self, env: CoMLRLEnv, agent: str, partners: Mapping[str, Partner]) -> None:
        if not isinstance(env, CoMLRLEnv):
            raise TypeError(f"env must be a CoMLRLEnv, got {type(env).__name__}.")
        if agent not in env.possible_agents:
            raise ValueError(f"agent must be one of {env.possible_agents}, got {agent!r}.")
        others = [a for a in env.possible_agents if a != agent]
        if not isinstance(partners, Mapping) or sorted(partners) != sorted(others):
            given = sorted(partners) if isinstance(partners, Mapping) else partners
            raise ValueError(
                f"partners must map every other agent {others} to a callable "
                f"observation -> completion, got {given!r:.120}; e.g. "
                f"partners={{{others[0]!r}: lambda prompt: 'an answer'}}."
                if others
                else f"env has one agent ({agent}), so partners must be {{}}, got {given!r:.120}."
            )
        for name, partner in partners.items():
            if not callable(partner):
                raise TypeError(
                    f"partners[{name!r}] must be a callable observation -> completion, "
                    f"got {type(partner).__name__} {partner!r:.80}."
                )
        self.env = env
        self.agent = agent
        self.partners = dict(partners)
        self.observation_space = env.observation_space(agent)
        self.action_space = env.action_space(agent)
        self.metadata = dict(env.metadata)
        self.render_mode = env.render_mode
        self._obs: dict[str, Obs] = {}

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Obs, dict[str, Any]]:
        """Reset the env with this ``seed`` and ``options`` (the seed restarts its item order)."""
        super().reset(seed=seed)
        self._obs, infos = self.env.reset(seed=seed, options=options)
        return self._obs[self.agent], infos[self.agent]

    def step(self, action: str) -> tuple[Obs, float, bool, bool, dict[str, Any]]:
        """``action`` for the agent, the partners' answers for the others: one joint turn."""
        actions = {a: self._act(a) for a in self.env.agents if a != self.agent}
        actions[self.agent] = action
        obs, rewards, terms, truncs, infos = self.env.step(actions)
        self._obs = obs
        a = self.agent
        return obs[a], rewards[a], terms[a], truncs[a], infos[a]

    def _act(self, agent: str) -> str:
        completion = self.partners[agent](self._obs[agent])
        if not isinstance(completion, str):
            raise TypeError(
                f"partners[{agent!r}] must return a completion str, got "
                f"{type(completion).__name__} {completion!r:.80}."
            )
        return completion

    def render(self) -> str | None:
        return self.env.render()

    def close(self) -> None:
        self.env.close()


def as_gymnasium(
    env: CoMLRLEnv, agent: str = "agent_0", partners: Mapping[str, Partner] | None = None
) -> CoMLRLGymnasiumEnv:
    """A ``gymnasium.Env`` in which ``agent`` acts and ``partners[other](obs)`` answer for the rest.

    ``partners`` may be omitted only for a one-agent env. For reproducible episodes the partners
    must be deterministic (or draw from the view's ``np_random``, which ``reset(seed=...)`` seeds).
    """
    return CoMLRLGymnasiumEnv(env, agent, {} if partners is None else partners)


def make_gymnasium_env(
    env_fn: Callable[..., CoMLRLEnv],
    agent: str = "agent_0",
    partners: Mapping[str, Partner] | None = None,
    render_mode: str | None = None,
) -> CoMLRLGymnasiumEnv:
    """``gymnasium.make(GYMNASIUM_ID, env_fn=..., partners=...)`` builds the view through this.

    ``env_fn(render_mode=...)`` must build a fresh ``CoMLRLEnv`` (``functools.partial`` does), so
    Gymnasium can re-make the env in each render mode and wrap it (``max_episode_steps=...``).
    """
    if not callable(env_fn) or isinstance(env_fn, CoMLRLEnv):
        raise TypeError(
            f"env_fn must be a function that builds a fresh CoMLRLEnv, got "
            f"{type(env_fn).__name__}; pass functools.partial(CoMLRLEnv, dataset, formatters, "
            "reward_func)."
        )
    return as_gymnasium(env_fn(render_mode=render_mode), agent, partners)


# Registered once per process, so `gymnasium.make` (and its spec, TimeLimit, re-making in every
# render mode for check_env) works without a registration step in user code.
GYMNASIUM_ID = "cmlrl/CoMLRL-v1"
if GYMNASIUM_ID not in gymnasium.registry:
    gymnasium.register(GYMNASIUM_ID, entry_point="cmlrl_env.gymnasium_view:make_gymnasium_env")
