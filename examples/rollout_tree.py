"""Draw the rollout tree of one MAGRPO round on the seed's two-turn length-feedback task.

No model: two scripted agents answer (agent 1 should write 2 to 3 times as much as agent 0;
after turn 1 both are told the lengths and answer again). G = 3 samples per agent and state,
``early_termination_threshold=0.9``: a joint answer already in the target range ends its branch.
The numbers are those a ``MAGRPOTrainer`` would train on (returns, then advantages over the G
siblings). Writes the PNG and, beside it, an HTML page with the full texts.

    python examples/rollout_tree.py --output docs/images/rollout-tree.png
"""

from __future__ import annotations

import argparse
from pathlib import Path

from cmlrl_agents import ScriptedPolicy, draw_rollout_tree, rollout_tree_view
from cmlrl_agents.foundation.rollout import collect_tree
from cmlrl_agents.policies.agent import SamplingConfig
from cmlrl_env import Task
from cmlrl_env.tasks import feedback_dataset, feedback_ratio_reward, length_feedback

SHORT = "Clouds hold a city of glass bridges."
LONG = (
    "Above the storms floats a city of glass bridges and copper towers, where bakers trade "
    "bread for rain and children fly kites between the chimneys at dawn."
)


def answer_first(prompt: str, g: int) -> str:
    """Agent 0 keeps its short answer."""
    return SHORT


def answer_second(prompt: str, g: int) -> str:
    """Agent 1 writes more or less: sample g stretches its answer by its own factor; after the
    feedback (turn 2) it moves towards 2.5 times agent 0's length."""
    turn_2 = "Your last answer" in prompt
    stretch = (1.6, 2.3, 3.2)[g] if not turn_2 else (1.9, 2.5, 3.6)[g]
    return LONG[: round(stretch * len(SHORT))].rstrip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=Path("rollout-tree.png"))
    args = parser.parse_args()
    task = Task(
        None,
        feedback_ratio_reward,
        num_agents=2,
        num_turns=2,
        external_transition=length_feedback,
        early_termination_threshold=0.9,
    )
    item = feedback_dataset()[0]
    agents = [ScriptedPolicy(answer_first), ScriptedPolicy(answer_second)]
    tree = collect_tree(
        task, agents, [(item, 0)], num_generations=3, sampling=SamplingConfig(max_new_tokens=64)
    )
    view = rollout_tree_view(tree, discount=1.0, advantage_mode="mean")
    png, page = draw_rollout_tree(view, args.output)
    print(f"{png}\n{page}")


if __name__ == "__main__":
    main()
