"""The seed's length-ratio task in a plain reset/step loop, with a scripted policy (no model).

Agent 0 writes a brief answer, agent 1 a detailed one; the shared reward is 1.0 when the detailed
answer is 2 to 3 times as long as the brief one and decays as exp(-distance) outside that band.
Swap ``scripted_policy`` for an LLM and the loop stays the same.

    python examples/custom_loop.py
"""

from __future__ import annotations

from cmlrl_env import CoMLRLEnv
from cmlrl_env.tasks import (
    brief_formatter,
    detailed_formatter,
    length_ratio_reward,
    length_ratio_splits,
)


def scripted_policy(agent: str, prompt: str, stretch: float) -> str:
    """A stand-in for an LLM: the detailed answer is ``stretch`` times as long as the brief one."""
    task = prompt.splitlines()[-1]  # the formatters put the task on the last line
    brief = f"In short: {task}"
    if agent == "agent_0":
        return brief
    return ((brief + " ") * 5)[: round(stretch * len(brief))]


def main() -> None:
    train_dataset, _ = length_ratio_splits()
    env = CoMLRLEnv(train_dataset, [brief_formatter, detailed_formatter], length_ratio_reward)
    for stretch in (2.5, 1.0, 4.0):
        rewards = []
        for _ in range(len(train_dataset)):  # one episode per task item, in dataset order
            obs, infos = env.reset()
            while env.agents:
                actions = {
                    agent: scripted_policy(agent, obs[agent], stretch) for agent in env.agents
                }
                obs, step_rewards, terminations, truncations, infos = env.step(actions)
            rewards.append(step_rewards["agent_0"])  # cooperative: every agent gets the same
        shown = ", ".join(f"{r:.3f}" for r in rewards)
        print(
            f"detailed answer {stretch}x as long: mean reward "
            f"{sum(rewards) / len(rewards):.3f}  [{shown}]"
        )
    env.close()


if __name__ == "__main__":
    main()
