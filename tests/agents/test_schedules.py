"""Learning-rate schedules with warmup (``transformers.get_scheduler``), held by the learners."""

from __future__ import annotations

import types

import pytest
from datasets import Dataset

from cmlrl_agents.algorithms.actor_critic import IACTrainer
from cmlrl_agents.algorithms.actor_critic_config import IACConfig
from cmlrl_agents.algorithms.magrpo import MAGRPOTrainer
from cmlrl_agents.algorithms.magrpo_config import MAGRPOConfig
from cmlrl_agents.learning.schedules import round_sizes
from cmlrl_agents.testing import tiny_agent
from cmlrl_env import tasks

FORMATTERS = [tasks.brief_formatter, tasks.detailed_formatter]
LR = 1e-2


def data(n: int = 6) -> Dataset:
    return tasks.length_ratio_dataset().select(range(n))


def magrpo(tmp_path, dataset=None, **config) -> MAGRPOTrainer:
    defaults = dict(
        rollout_buffer_size=2,
        num_generations=2,
        max_new_tokens=4,
        eval_interval=0,
        agent_learning_rate=LR,
        lr_scheduler_type="linear",
        warmup_steps=1,
        output_dir=str(tmp_path / "run"),
    )
    return MAGRPOTrainer(
        agents=[tiny_agent(seed=0), tiny_agent(seed=1)],
        formatters=FORMATTERS,
        reward_func=tasks.length_ratio_reward,
        train_dataset=data() if dataset is None else dataset,
        args=MAGRPOConfig(**{**defaults, **config}),
    )


def record_step_lrs(trainer) -> list[float]:
    """The learning rate of each step agent 0's optimizer takes."""
    seen: list[float] = []
    optimizer = trainer.learner.optimizers[0]
    step = optimizer.step

    def recording(self, *args, **kwargs):
        seen.append(self.param_groups[0]["lr"])
        return step(*args, **kwargs)

    # A bound method: the LR schedulers built at train() wrap the optimizer's step method.
    optimizer.step = types.MethodType(recording, optimizer)
    return seen


def test_round_sizes_follow_the_loop_cut() -> None:
    assert list(round_sizes(8, 3)) == [3, 3, 2]  # evaluation never cuts a round
    assert list(round_sizes(5, 2)) == [2, 2, 1]


def test_linear_warmup_then_decay_over_the_runs_optimizer_steps(tmp_path) -> None:
    trainer = magrpo(tmp_path)
    seen = record_step_lrs(trainer)
    trainer.train()
    # 6 items, 2 per round, one step per round: 3 steps; warmup 1 step, then linear to 0.
    assert seen == pytest.approx([0.0, LR, LR / 2])
    assert trainer.learner.schedulers["agent_0"].last_epoch == 3
    assert trainer.optimizers[1].param_groups[0]["lr"] == pytest.approx(0.0)


def test_cosine_and_constant_with_warmup(tmp_path) -> None:
    cosine = magrpo(tmp_path / "c", lr_scheduler_type="cosine", warmup_steps=0)
    seen = record_step_lrs(cosine)
    cosine.train()
    assert seen == pytest.approx([LR, LR * 0.75, LR * 0.25])  # 0.5 * (1 + cos(pi * k / 3)) * LR
    constant = magrpo(tmp_path / "w", lr_scheduler_type="constant", warmup_steps=2)
    seen = record_step_lrs(constant)
    constant.train()
    assert seen == pytest.approx([0.0, LR / 2, LR])
    plain = magrpo(tmp_path / "p", lr_scheduler_type="constant", warmup_steps=0)
    plain.train()
    assert plain.learner.schedulers == {}  # no schedule: the checkpoints hold none either


def test_a_resumed_run_continues_its_schedule(tmp_path) -> None:
    trainer = magrpo(tmp_path, save_steps=2)
    trainer.train()
    fresh = magrpo(tmp_path, save_steps=2)
    fresh.load_checkpoint(tmp_path / "run" / "checkpoints" / "checkpoint-4")
    scheduler = fresh.learner.schedulers["agent_0"]
    assert scheduler.last_epoch == 2
    assert fresh.optimizers[0].param_groups[0]["lr"] == pytest.approx(LR / 2)
    resumed = magrpo(tmp_path, save_steps=2)
    seen = record_step_lrs(resumed)
    resumed.train(resume_from_checkpoint=tmp_path / "run" / "checkpoints" / "checkpoint-4")
    assert seen == pytest.approx([LR / 2])  # the third and last step of the schedule


def test_actor_critic_schedules_actors_and_critics(tmp_path) -> None:
    args = IACConfig(
        rollout_buffer_size=2,
        max_new_tokens=4,
        eval_interval=0,
        agent_learning_rate=LR,
        critic_learning_rate=2 * LR,
        lr_scheduler_type="linear",
        output_dir=str(tmp_path / "run"),
        early_termination_threshold=None,
    )
    trainer = IACTrainer(
        agents=[tiny_agent(seed=0), tiny_agent(seed=1)],
        critics=[tiny_agent(seed=2).model, tiny_agent(seed=3).model],
        tokenizer=tiny_agent(seed=0).tokenizer,
        formatters=FORMATTERS,
        reward_func=tasks.length_ratio_reward,
        train_dataset=data(4),
        args=args,
    )
    trainer.train()
    assert sorted(trainer.learner.schedulers) == ["agent_0", "agent_1", "critic_0", "critic_1"]
    # 2 rounds, one step each: linear from the lr to 0 over 2 steps.
    assert all(s.last_epoch == 2 for s in trainer.learner.schedulers.values())
    assert trainer.critic_optimizers[0].param_groups[0]["lr"] == pytest.approx(0.0)


def test_a_decaying_schedule_needs_a_map_style_dataset(tmp_path) -> None:
    stream = data().to_iterable_dataset()
    with pytest.raises(ValueError, match="lr_scheduler_type='linear' decays over the run's"):
        magrpo(tmp_path, dataset=stream).train()
    magrpo(tmp_path / "w", dataset=stream, lr_scheduler_type="constant").train()


def test_bad_schedule_settings_raise() -> None:
    with pytest.raises(
        ValueError,
        match=r"lr_scheduler_type must be one of \['constant', 'linear', 'cosine'\], got 'step'",
    ):
        MAGRPOConfig(lr_scheduler_type="step")
    with pytest.raises(ValueError, match="warmup_steps"):
        MAGRPOConfig(warmup_steps=-1)
