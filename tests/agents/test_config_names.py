"""TRL's names for config fields get a message naming the field to use, in Python (built or
assigned) and on the command line, from one table; the guide's table matches it."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from datasets import Dataset

from cmlrl_agents import (
    IACConfig,
    MADPOConfig,
    MAGRPOConfig,
    MAGRPOTrainer,
    MARLHFConfig,
)
from cmlrl_agents.cli.commands import main
from cmlrl_agents.foundation.config_names import COMLRL_NAMES, FOREIGN_NAMES, SAME_AS_TRL
from cmlrl_agents.testing import tiny_agent

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = (MAGRPOConfig, IACConfig, MADPOConfig, MARLHFConfig)


def all_fields() -> set[str]:
    return {f.name for cls in CONFIGS for f in dataclasses.fields(cls)}


def test_the_table_points_at_fields_that_exist_and_never_shadows_one() -> None:
    fields = all_fields()
    # num_iterations is MADPO's and MARLHF's own field (rounds): the table answers it only in
    # the configs that lack it, where TRL's meaning is ppo_epochs.
    assert set(FOREIGN_NAMES) & fields == {"num_iterations"}
    assert not set(COMLRL_NAMES) & fields
    for name, (targets, _) in FOREIGN_NAMES.items():
        assert set(targets) <= fields, name
    assert set(SAME_AS_TRL) <= {f.name for f in dataclasses.fields(MAGRPOConfig)}


@pytest.mark.parametrize(
    ("cls", "name", "expected"),
    [
        (
            MAGRPOConfig,
            "learning_rate",
            "MAGRPOConfig has no field 'learning_rate' (TRL's name); use agent_learning_rate: "
            "AdamW learning rate of every agent (a critic's is critic_learning_rate).",
        ),
        (MAGRPOConfig, "max_completion_length", "use max_new_tokens: tokens generated"),
        (MAGRPOConfig, "beta", "use reference_kl_coef: the pull towards the reference model"),
        (MADPOConfig, "beta", "MADPOConfig has no field 'beta' (TRL's name); use dpo_beta:"),
        (MAGRPOConfig, "beta", "use reference_kl_coef: the pull towards the reference model (it"),
        (MAGRPOConfig, "num_iterations", "(TRL's name); use ppo_epochs: passes over each"),
        (IACConfig, "num_iterations", "IACConfig has no field 'num_iterations' (TRL's name); use"),
        (MAGRPOConfig, "checkpoint_interval", "(comlrl's name); use save_steps: training task"),
        (MAGRPOConfig, "checkpoint_dir", "(comlrl's name); use output_dir: checkpoints go to"),
        (MAGRPOConfig, "report_to", "(TRL's name): W&B is on when the trainer gets wandb_config"),
        (MAGRPOConfig, "per_device_train_batch_size", "use rollout_buffer_size: batches here"),
        (
            IACConfig,
            "loss_type",
            "IACConfig has no field 'loss_type' (TRL's name), nor a counterpart: "
            "loss_aggregation belongs to other configs.",
        ),
        (MAGRPOConfig, "agent_learnin_rate", "(did you mean 'agent_learning_rate'?); valid"),
    ],
)
def test_a_foreign_name_says_what_to_write(cls: type, name: str, expected: str) -> None:
    with pytest.raises(TypeError) as built:
        cls(**{name: 1})
    assert expected in str(built.value)
    config = cls()
    with pytest.raises(AttributeError) as assigned:
        setattr(config, name, 1)
    assert str(assigned.value) == str(built.value)


def test_the_command_line_uses_the_same_table(capsys) -> None:
    tiny = ROOT / "examples" / "configs" / "tiny.yaml"
    assert main(["check", str(tiny), "--set", "config.learning_rate=1e-5"]) == 2
    assert capsys.readouterr().err == (
        "cmlrl check: error: config: MAGRPOConfig has no field 'learning_rate' (TRL's name); use "
        "agent_learning_rate: AdamW learning rate of every agent (a critic's is "
        "critic_learning_rate).\n"
    )


def test_the_guide_lists_every_name_of_the_table() -> None:
    text = (ROOT / "docs" / "experiments.md").read_text(encoding="utf-8")
    section = text.split("## Coming from TRL")[1].split("\n## ")[0]
    rows = re.findall(r"^\| (`.*?) \|", section, flags=re.M)
    listed = {name for row in rows for name in re.findall(r"`(\w+)`", row)}
    assert listed == set(FOREIGN_NAMES)
    assert ", ".join(f"`{n}`" for n in SAME_AS_TRL) in " ".join(section.split())


def test_log_history_is_the_loggers_history(tmp_path) -> None:
    args = MAGRPOConfig(
        num_agents=2, num_generations=2, max_new_tokens=3, eval_interval=0, verbose=False
    )
    args.output_dir = str(tmp_path / "run")
    trainer = MAGRPOTrainer(
        agents=[tiny_agent(seed=0), tiny_agent(seed=1)],
        reward_func=lambda a, b: [float(len(x) < len(y)) for x, y in zip(a, b, strict=True)],
        train_dataset=Dataset.from_dict({"prompt": ["p0", "p1"]}),
        args=args,
    )
    trainer.train()
    trainer.close()
    step, metrics = trainer.logger.history[-1]
    assert isinstance(step, int) and "turn_1/reward_mean" in metrics
    jsonl = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(jsonl) == len(trainer.logger.history)
