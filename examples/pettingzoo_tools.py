"""PettingZoo tooling on a cmlrl task: the conformance suite, the AEC view, wrappers.

Uses the seed's two-turn length-feedback task (agent 1 should answer 2-3 times as long as
agent 0; after turn 1 each agent is told the lengths and asked again). No model: a scripted
policy answers.

    python examples/pettingzoo_tools.py
"""

from __future__ import annotations

import functools

from pettingzoo.utils import BaseParallelWrapper, parallel_to_aec
from pettingzoo.utils.wrappers import MultiEpisodeParallelEnv

from cmlrl_env import CoMLRLEnv, check_env
from cmlrl_env.tasks import feedback_dataset, feedback_ratio_reward, length_feedback

# A factory, not an env: the checks build fresh envs, some with render_mode or
# dict_observations, so it must forward keyword arguments (functools.partial does).
make_env = functools.partial(
    CoMLRLEnv,
    feedback_dataset(),
    None,
    feedback_ratio_reward,
    num_turns=2,
    external_transition=length_feedback,
    early_termination_threshold=0.9,
)


def scripted_policy(agent: str, prompt: str) -> str:
    """Turn 1: equally long answers. After the feedback, agent 1 writes 2.5 times as much.

    Agent 0 leaves trailing whitespace, as LLMs do; the wrapper below strips it.
    """
    brief = "A quiet answer."
    if agent == "agent_0":
        return brief + "  "
    stretch = 2.5 if "Your last answer" in prompt else 1.0
    return ((brief + " ") * 3)[: round(stretch * len(brief))]


class StripCompletions(BaseParallelWrapper):
    """Strip the whitespace LLMs leave around completions before the env scores them."""

    def step(self, actions: dict[str, str]) -> tuple[dict, dict, dict, dict, dict]:
        return super().step({agent: text.strip() for agent, text in actions.items()})


def main() -> None:
    # 1. PettingZoo's test suite plus cmlrl's multi-turn determinism and text checks.
    print("check_env passed:", ", ".join(check_env(make_env)))

    # 2. The AEC view: agents act one after another; the parallel step runs once all have acted.
    aec_env = parallel_to_aec(make_env())
    aec_env.reset(seed=0)
    for agent in aec_env.agent_iter():
        observation, reward, termination, truncation, info = aec_env.last()
        if termination or truncation:
            action = None  # PettingZoo's AEC protocol: finished agents step with None
            print(f"AEC {agent} done after turn {info['turn']}, last reward {reward:.3f}")
        else:
            action = scripted_policy(agent, observation)
            print(
                f"AEC {agent} turn {info['turn'] + 1}: {len(action)} characters, "
                f"previous turn's reward {reward:.3f}"
            )
        aec_env.step(action)

    # 3. Wrappers: strip completions, and play every task item as one long episode.
    env = MultiEpisodeParallelEnv(
        StripCompletions(make_env()), num_episodes=len(feedback_dataset())
    )
    observations, infos = env.reset(seed=0)
    turn_rewards: list[float] = []
    while env.agents:
        actions = {agent: scripted_policy(agent, observations[agent]) for agent in env.agents}
        observations, rewards, terminations, truncations, infos = env.step(actions)
        turn_rewards.append(rewards["agent_0"])
    print(
        f"MultiEpisodeParallelEnv: {len(turn_rewards)} turns over {len(feedback_dataset())} "
        "task items, rewards " + ", ".join(f"{r:.3f}" for r in turn_rewards)
    )


if __name__ == "__main__":
    main()
