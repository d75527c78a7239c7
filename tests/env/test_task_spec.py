"""``TaskSpec``: one frozen, validated task that the env, ``check_task`` and the trainers take."""

from __future__ import annotations

import dataclasses

import pytest
from datasets import Dataset

from cmlrl_env import CoMLRLEnv, TaskSpec, check_task, tasks

FORMATTERS = [tasks.brief_formatter, tasks.detailed_formatter]


def spec(**changes) -> TaskSpec:
    fields = {
        "dataset": tasks.length_ratio_dataset(),
        "formatters": FORMATTERS,
        "reward_func": tasks.length_ratio_reward,
    }
    return TaskSpec(**{**fields, **changes})


def test_the_team_size_is_resolved_and_the_spec_is_frozen() -> None:
    s = spec()
    assert s.num_agents == 2  # from the two formatters
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.num_turns = 2  # type: ignore[misc]


@pytest.mark.parametrize(
    ("changes", "error", "match"),
    [
        ({"reward_func": None}, TypeError, "needs reward_func"),
        ({"max_prompt_chars": 0}, ValueError, "max_prompt_chars must be an int >= 1, got 0"),
        ({"num_turns": 2}, ValueError, "num_turns=2 needs external_transition"),
        ({"item_order": "random"}, ValueError, "item_order must be one of"),
        ({"dataset": Dataset.from_dict({"prompt": []})}, ValueError, "is empty"),
        ({"num_agents": 3}, ValueError, "num_agents"),
    ],
)
def test_bad_pieces_raise_at_construction(changes, error, match) -> None:
    with pytest.raises(error, match=match):
        spec(**changes)


def test_the_env_plays_its_spec() -> None:
    s = spec(max_completion_chars=7, early_termination_threshold=None)
    env = CoMLRLEnv.from_spec(s, dict_observations=True)
    assert env.spec == s
    assert env.action_space("agent_0").max_length == 7
    assert env.task.early_termination_threshold is None
    observations, _ = env.reset(seed=0)
    assert observations["agent_0"]["prompt"] == tasks.brief_formatter(s.dataset[0])
    # The keyword form builds the same spec.
    keywords = {f.name: getattr(s, f.name) for f in dataclasses.fields(s)}
    assert CoMLRLEnv(**keywords).spec == s
    with pytest.raises(TypeError, match="spec must be a cmlrl_env.TaskSpec, got dict"):
        CoMLRLEnv.from_spec(keywords)  # type: ignore[arg-type]


def test_check_task_takes_a_spec() -> None:
    s = spec(early_termination_threshold=None)
    by_spec = check_task(s, num_items=2)
    by_keywords = check_task(
        s.dataset,
        FORMATTERS,
        tasks.length_ratio_reward,
        early_termination_threshold=None,
        num_items=2,
    )
    assert by_spec == by_keywords
    assert by_spec.ok


def test_trainers_build_the_spec_from_the_seed_keywords(tmp_path) -> None:
    from cmlrl_agents.algorithms.magrpo import MAGRPOTrainer
    from cmlrl_agents.algorithms.magrpo_config import MAGRPOConfig
    from cmlrl_agents.testing import tiny_agent

    args = MAGRPOConfig(num_turns=1, early_termination_threshold=None, output_dir=str(tmp_path))
    trainer = MAGRPOTrainer(
        agents=[tiny_agent(0), tiny_agent(1)],
        train_dataset=tasks.length_ratio_dataset(),
        formatters=FORMATTERS,
        reward_func=tasks.length_ratio_reward,
        args=args,
    )
    assert trainer.env.spec == spec(early_termination_threshold=None).replace(
        dataset=trainer.env.spec.dataset
    )
