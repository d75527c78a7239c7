"""Trainers over streamed task sets: every epoch is a pass, and a pass with no item is an error."""

from __future__ import annotations

import re

import pytest
from datasets import Dataset, IterableDataset

from cmlrl_agents.algorithms.magrpo import MAGRPOTrainer
from cmlrl_agents.algorithms.magrpo_config import MAGRPOConfig
from cmlrl_agents.testing import tiny_agent
from cmlrl_env import CoMLRLEnv, tasks

FORMATTERS = [tasks.brief_formatter, tasks.detailed_formatter]
ROWS = [
    {"prompt": p, "target_min": 2.0, "target_max": 3.0}
    for p in ("Describe a cloud.", "Invent a holiday.", "Name a river.")
]


def trainer_on(dataset: IterableDataset, tmp_path, epochs: int) -> MAGRPOTrainer:
    args = MAGRPOConfig(
        num_agents=2,
        num_train_epochs=epochs,
        num_generations=2,
        max_new_tokens=4,
        eval_interval=0,
        logging_steps=1,
        output_dir=str(tmp_path / "run"),
    )
    return MAGRPOTrainer(
        agents=[tiny_agent(seed=0), tiny_agent(seed=1)],
        formatters=FORMATTERS,
        reward_func=tasks.length_ratio_reward,
        train_dataset=dataset,
        args=args,
    )


def one_shot(rows: list[dict]) -> IterableDataset:
    used_up = iter(rows)
    return IterableDataset.from_generator(lambda: used_up)  # iterating again gives nothing


def test_a_restartable_stream_is_read_once_per_epoch(tmp_path) -> None:
    stream = Dataset.from_list(ROWS).to_iterable_dataset()
    trainer = trainer_on(stream, tmp_path, epochs=2)
    trainer.train()
    assert (trainer.items_seen, trainer.epoch) == (6, 2)


def test_a_one_shot_stream_fails_clearly_at_the_second_epoch(tmp_path) -> None:
    trainer = trainer_on(one_shot(ROWS), tmp_path, epochs=2)
    with pytest.raises(
        ValueError,
        match=r"^train_dataset yielded no items on pass 2: it is an IterableDataset that cannot "
        r"restart \(a one-shot stream",
    ):
        trainer.train()
    assert (trainer.items_seen, trainer.epoch) == (3, 1)  # epoch 1 trained, epoch 2 refused


def test_an_empty_stream_gets_the_envs_message(tmp_path) -> None:
    def empty() -> IterableDataset:
        return IterableDataset.from_generator(lambda: iter(()))

    with pytest.raises(ValueError) as from_trainer:
        trainer_on(empty(), tmp_path, epochs=1).train()
    with pytest.raises(ValueError) as from_env:
        CoMLRLEnv(empty(), None, lambda c1, c2: [0.0]).reset()
    message = "is empty: the IterableDataset yielded no items; give at least one task item."
    assert str(from_trainer.value) == "train_dataset " + message
    assert str(from_env.value) == "dataset " + message


def test_trainers_refuse_an_env_with_a_shuffled_item_order(tmp_path) -> None:
    env = CoMLRLEnv(
        Dataset.from_list(ROWS), FORMATTERS, tasks.length_ratio_reward, item_order="shuffle"
    )
    with pytest.raises(
        ValueError,
        match=re.escape("env has item_order='shuffle', but trainers read the task items in "),
    ):
        MAGRPOTrainer(
            agents=[tiny_agent(seed=0), tiny_agent(seed=1)],
            env=env,
            args=MAGRPOConfig(num_agents=2, output_dir=str(tmp_path / "run")),
        )
