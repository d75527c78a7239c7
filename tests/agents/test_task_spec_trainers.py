"""One ``TaskSpec`` travels whole: from the run file's task section through the CLI's plan to
the trainer's env, and into the centralized trainer (issue 10)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cmlrl_agents.algorithms.centralized import CentralizedMAGRPOConfig, CentralizedMAGRPOTrainer
from cmlrl_agents.algorithms.magrpo import MAGRPOTrainer
from cmlrl_agents.algorithms.magrpo_config import MAGRPOConfig
from cmlrl_agents.cli.plan import build_trainer, plan
from cmlrl_agents.cli.spec import load_spec
from cmlrl_agents.cli.tasks import TASK_SPEC_OPTIONS
from cmlrl_agents.testing import tiny_agent
from cmlrl_env import (
    DEFAULT_EARLY_TERMINATION_THRESHOLD,
    CoMLRLEnv,
    TaskSpec,
    tasks,
    writing_tasks,
)

TINY = Path(__file__).resolve().parents[2] / "examples" / "configs" / "tiny.yaml"


def test_every_env_option_of_the_spec_is_a_task_key_of_the_run_file() -> None:
    assert TASK_SPEC_OPTIONS == ("max_prompt_chars", "max_completion_chars")


def test_a_task_option_of_the_run_file_reaches_the_trainer_env(tmp_path) -> None:
    spec = load_spec(TINY)
    spec["task"]["max_completion_chars"] = 321
    spec["config"]["output_dir"] = str(tmp_path / "run")
    p = plan(spec)
    trainer = build_trainer(p, use_wandb=False)
    assert trainer.env.spec.max_completion_chars == 321
    assert trainer.env.action_space("agent_1").max_length == 321
    assert trainer.env.spec == p.task.spec(p.config)  # one spec, passed whole
    assert trainer.eval_env.spec.max_completion_chars == 321


def test_a_trainer_takes_the_spec_whole_or_its_seed_keywords_alike(tmp_path) -> None:
    train, evaluation = tasks.length_ratio_splits()
    formatters = [tasks.brief_formatter, tasks.detailed_formatter]
    args = MAGRPOConfig(num_generations=2, output_dir=str(tmp_path / "a"))
    spec = TaskSpec(train, formatters, tasks.length_ratio_reward)
    whole = MAGRPOTrainer(agents=[tiny_agent(), tiny_agent(1)], task=spec, args=args)
    loose = MAGRPOTrainer(
        agents=[tiny_agent(), tiny_agent(1)],
        train_dataset=train,
        formatters=formatters,
        reward_func=tasks.length_ratio_reward,
        args=args,
    )
    assert whole.spec == loose.spec == spec
    with pytest.raises(ValueError, match="task= already holds the dataset"):
        MAGRPOTrainer(agents=[tiny_agent()] * 2, task=spec, train_dataset=train, args=args)
    with pytest.raises(ValueError, match=r"task has num_turns=1 but args.num_turns=2"):
        MAGRPOTrainer(
            agents=[tiny_agent()] * 2,
            task=spec,
            args=MAGRPOConfig(num_turns=2, early_termination_threshold=None),
        )
    with pytest.raises(TypeError, match="task must be a cmlrl_env.TaskSpec, got dict"):
        MAGRPOTrainer(agents=[tiny_agent()] * 2, task={"dataset": train}, args=args)


def test_the_task_owns_its_turns_and_threshold_and_the_config_need_not_repeat_them(
    tmp_path,
) -> None:
    train = tasks.feedback_dataset()
    spec = TaskSpec(
        train,
        None,
        tasks.feedback_ratio_reward,
        external_transition=tasks.length_feedback,
        num_agents=2,
        num_turns=2,
        early_termination_threshold=0.9,
    )
    agents = [tiny_agent(), tiny_agent(1)]
    args = MAGRPOConfig(num_generations=2, output_dir=str(tmp_path / "a"))
    assert (args.num_turns, args.early_termination_threshold) == (None, "task")
    trainer = MAGRPOTrainer(agents=agents, env=CoMLRLEnv.from_spec(spec), args=args)
    assert trainer.num_turns == 2 and trainer.spec.early_termination_threshold == 0.9
    assert trainer.learner.num_turns == 2
    # Set, they must agree; the same values are accepted.
    same = MAGRPOConfig(
        num_turns=2, early_termination_threshold=0.9, output_dir=str(tmp_path / "b")
    )
    assert MAGRPOTrainer(agents=agents, task=spec, args=same).num_turns == 2
    with pytest.raises(ValueError, match=r"task has early_termination_threshold=0.9 but args"):
        MAGRPOTrainer(agents=agents, task=spec, args=MAGRPOConfig(early_termination_threshold=None))
    # Built from the seed's keywords, unset means 1 turn and the env's threshold.
    loose = MAGRPOTrainer(
        agents=agents,
        train_dataset=train,
        formatters=[tasks.brief_formatter, tasks.detailed_formatter],
        reward_func=tasks.length_ratio_reward,
        args=MAGRPOConfig(num_generations=2, output_dir=str(tmp_path / "c")),
    )
    assert loose.spec.num_turns == 1
    assert loose.spec.early_termination_threshold == DEFAULT_EARLY_TERMINATION_THRESHOLD
    with pytest.raises(TypeError, match="early_termination_threshold must be a number, None"):
        MAGRPOConfig(early_termination_threshold="never")


@pytest.mark.parametrize("trainer", ["iac", "madpo", "centralized"])
def test_a_trainer_of_chains_or_one_turn_refuses_a_task_whose_turns_it_cannot_play(
    trainer, tmp_path
) -> None:
    from cmlrl_agents import IACConfig, IACTrainer, MADPOConfig, MADPOTrainer

    spec = TaskSpec(
        tasks.feedback_dataset(),
        None,
        tasks.feedback_ratio_reward,
        external_transition=tasks.length_feedback,
        num_agents=2,
        num_turns=2,
    )
    out = str(tmp_path / "run")
    if trainer == "iac":
        with pytest.raises(ValueError, match="num_generations=2 with num_turns=2"):
            IACTrainer(
                agents=[tiny_agent(), tiny_agent(1)],
                task=spec,
                args=IACConfig(num_generations=2, output_dir=out),
            )
    elif trainer == "madpo":
        with pytest.raises(ValueError, match="task has num_turns=2: MADPOTrainer compares"):
            MADPOTrainer(agents=[tiny_agent(), tiny_agent(1)], task=spec, args=MADPOConfig())
    else:
        with pytest.raises(ValueError, match="task has num_turns=2: the centralized baseline"):
            CentralizedMAGRPOTrainer(
                agents=[tiny_agent()], task=spec, args=CentralizedMAGRPOConfig(output_dir=out)
            )


def test_the_centralized_trainer_wraps_a_team_spec_and_keeps_its_options(tmp_path) -> None:
    train, _ = writing_tasks.writing_splits()
    team = TaskSpec(
        train.select(range(2)),
        [writing_tasks.summary_formatter, writing_tasks.expansion_formatter],
        writing_tasks.writing_reward,
        max_completion_chars=999,
    )
    trainer = CentralizedMAGRPOTrainer(
        agents=[tiny_agent()],
        task=team,
        args=CentralizedMAGRPOConfig(num_generations=2, output_dir=str(tmp_path / "c")),
    )
    assert (trainer.num_agents, trainer.num_roles) == (1, 2)
    assert trainer.spec.num_agents == 1 and trainer.spec.max_completion_chars == 999
    assert trainer.spec.dataset is team.dataset
