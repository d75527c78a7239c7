"""Runs never mix, resume checks what it restores, damaged checkpoints are named, settings read
once refuse to change, secrets stay out of every file (issue 9, items 9-12, 19, 20)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cmlrl_agents import MAGRPOConfig, MAGRPOTrainer
from cmlrl_agents.algorithms.actor_critic import IACTrainer
from cmlrl_agents.algorithms.actor_critic_config import IACConfig
from cmlrl_agents.cli.commands import main
from cmlrl_agents.policies.agent import LLMAgent
from cmlrl_agents.runs.checkpoint import CheckpointError, latest_checkpoint, load_checkpoint
from cmlrl_agents.runs.redaction import REDACTED, is_secret_key, is_secret_value, redact_secrets
from cmlrl_agents.testing import tiny_agent, tiny_model, tiny_tokenizer
from cmlrl_env import tasks

ROOT = Path(__file__).resolve().parents[2]
TINY_RUN = ROOT / "examples" / "configs" / "tiny.yaml"


def make(out: Path | None, *, agents=None, data_range=range(4), **config) -> MAGRPOTrainer:
    """4 items, G=2, 2 items per round: two rounds of 4 env_steps each."""
    fields = dict(
        num_generations=2,
        max_new_tokens=4,
        rollout_buffer_size=2,
        eval_interval=0,
        logging_steps=1,
        agent_learning_rate=1e-3,
        seed=0,
        output_dir=None if out is None else str(out),
    )
    return MAGRPOTrainer(
        agents=agents or [tiny_agent(0), tiny_agent(1)],
        formatters=[tasks.brief_formatter, tasks.detailed_formatter],
        reward_func=tasks.length_ratio_reward,
        train_dataset=tasks.length_ratio_dataset().select(data_range),
        args=MAGRPOConfig(**{**fields, **config}),
    )


def weights(trainer) -> list[torch.Tensor]:
    return [p.detach().clone() for a in trainer.agents for p in a.model.parameters()]


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory) -> Path:
    """A finished run with checkpoints after items 2 and 4."""
    out = tmp_path_factory.mktemp("saved") / "run"
    trainer = make(out, save_steps=2)
    trainer.train()
    trainer.close()
    return out


# ------------------------------------------------------------------ 9: one run per folder
def test_a_fresh_run_refuses_a_folder_with_another_runs_checkpoints(tmp_path):
    out = tmp_path / "run"
    first = make(out, save_steps=2)
    first.train()
    first.close()
    old_state = (out / "checkpoints" / "checkpoint-4" / "trainer_state.json").read_text()
    second = make(out, save_steps=2, agent_learning_rate=2e-3)
    before = weights(second)
    with pytest.raises(FileExistsError, match="overwrite_output_dir=True") as err:
        second.train()
    assert "checkpoint-2, checkpoint-4" in str(err.value)
    # nothing of the old run was touched, nothing of the new one trained
    assert (out / "checkpoints" / "checkpoint-4" / "trainer_state.json").read_text() == old_state
    assert json.loads((out / "config.json").read_text())["agent_learning_rate"] == 1e-3
    assert same(before, weights(second)) and second.items_seen == 0
    # asked for: the old checkpoints go, the new run's take their place
    second.args.overwrite_output_dir = True
    second.train(resume_from_checkpoint=None)
    second.close()
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [
        "checkpoint-2",
        "checkpoint-4",
    ]
    state = json.loads((out / "checkpoints" / "checkpoint-4" / "trainer_state.json").read_text())
    assert state["trainer_state"]["run"]["run_id"] == second.run_id != first.run_id
    assert json.loads((out / "config.json").read_text())["agent_learning_rate"] == 2e-3
    # a resume is no fresh start: it adopts the run
    third = make(out, save_steps=2, agent_learning_rate=2e-3)
    third.train(resume_from_checkpoint="latest")
    assert third.run_id == second.run_id and third.items_seen == 4


def test_default_run_folders_are_unique_within_one_second(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    folders = {make(None).run_dir for _ in range(3)}
    assert len(folders) == 3
    assert all(f.parent == Path("runs") and f.name.startswith("magrpo-") for f in folders)


def test_training_twice_in_one_trainer_is_not_a_foreign_run(tmp_path):
    trainer = make(tmp_path / "run", save_steps=2)
    trainer.train()
    trainer.args.num_train_epochs = 2
    trainer.train()
    assert trainer.items_seen == 8


# --------------------------------------------------------- 10: resume checks what it restores
def test_resume_refuses_a_different_setup_and_names_every_field(saved_run, tmp_path):
    tokenizer = tiny_tokenizer()
    smaller = [LLMAgent(tiny_model(len(tokenizer), i, hidden_size=16), tokenizer) for i in (0, 1)]
    other = make(tmp_path / "other", agents=smaller, num_generations=3, data_range=range(1, 5))
    before = weights(other)
    with pytest.raises(ValueError, match="cannot resume") as err:
        other.load_checkpoint(saved_run / "checkpoints" / "checkpoint-4")
    message = str(err.value)
    assert "num_generations: 2 in the checkpoint, 3 now" in message
    assert "model_parameters" in message and "train_dataset" in message
    assert "num_agents" not in message and "algorithm" not in message
    assert same(before, weights(other)) and other.items_seen == 0


def test_resume_takes_the_new_learning_rate_and_true_means_latest(saved_run, tmp_path):
    import shutil

    out = tmp_path / "run"
    shutil.copytree(saved_run, out)
    trainer = make(out, save_steps=2, agent_learning_rate=3e-4)
    trainer.train(resume_from_checkpoint=True)
    assert trainer.items_seen == 4 and trainer.env_step == 8
    saved = torch.load(out / "checkpoints" / "checkpoint-4" / "optim-agent_0.pt", weights_only=True)
    assert saved["param_groups"][0]["lr"] == 3e-4  # the final save holds the new lr too
    for optimizer in trainer.optimizers:
        assert [g["lr"] for g in optimizer.param_groups] == [3e-4]
    with pytest.raises(TypeError, match="resume_from_checkpoint must be"):
        trainer.train(resume_from_checkpoint=4)


def test_actor_critic_resume_sets_actor_and_critic_learning_rates(tmp_path):
    tokenizer = tiny_tokenizer()

    def build(lr: float, critic_lr: float) -> IACTrainer:
        return IACTrainer(
            agents=[tiny_model(len(tokenizer), i, eos_bias=4.0) for i in (0, 1)],
            critics=[tiny_model(len(tokenizer), 10 + i) for i in (0, 1)],
            tokenizer=tokenizer,
            formatters=[tasks.brief_formatter, tasks.detailed_formatter],
            reward_func=tasks.length_ratio_reward,
            train_dataset=tasks.length_ratio_dataset().select(range(2)),
            args=IACConfig(
                max_new_tokens=4,
                rollout_buffer_size=2,
                eval_interval=0,
                agent_learning_rate=lr,
                critic_learning_rate=critic_lr,
                save_steps=2,
                output_dir=str(tmp_path / "run"),
            ),
        )

    first = build(1e-3, 2e-3)
    first.train()
    resumed = build(4e-4, 5e-4)
    resumed.train(resume_from_checkpoint="latest")
    assert [g["lr"] for o in resumed.optimizers for g in o.param_groups] == [4e-4, 4e-4]
    assert [g["lr"] for o in resumed.critic_optimizers for g in o.param_groups] == [5e-4, 5e-4]


# ------------------------------------------------------------ 11: damaged checkpoints
def _damage(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_damaged_file_is_named_and_nothing_is_loaded(saved_run, tmp_path):
    import shutil

    ckpt = tmp_path / "checkpoint-4"
    shutil.copytree(saved_run / "checkpoints" / "checkpoint-4", ckpt)
    _damage(ckpt / "model-agent_1.safetensors")
    trainer = make(tmp_path / "fresh")
    before = weights(trainer)
    with pytest.raises(CheckpointError, match=r"model-agent_1\.safetensors is damaged") as err:
        trainer.load_checkpoint(ckpt)
    assert "weights_only" not in str(err.value)
    assert same(before, weights(trainer)) and trainer.items_seen == 0


def test_an_unreadable_optimizer_file_is_named_without_weights_only_advice(saved_run, tmp_path):
    import hashlib
    import shutil

    ckpt = tmp_path / "checkpoint-4"
    shutil.copytree(saved_run / "checkpoints" / "checkpoint-4", ckpt)
    # A file that passes its checksum but cannot be read (written by something else).
    bad = ckpt / "optim-agent_1.pt"
    torch.save({"x": torch.nn.Linear(1, 1)}, bad)  # a pickled module: refused by weights_only
    manifest = json.loads((ckpt / "trainer_state.json").read_text())
    manifest["files"][bad.name] = hashlib.sha256(bad.read_bytes()).hexdigest()
    (ckpt / "trainer_state.json").write_text(json.dumps(manifest))
    trainer = make(tmp_path / "fresh")
    before = weights(trainer)
    with pytest.raises(CheckpointError, match=r"optim-agent_1\.pt is damaged") as err:
        trainer.load_checkpoint(ckpt)
    assert "weights_only" not in str(err.value) and err.value.__cause__ is None
    assert same(before, weights(trainer))
    # a broken manifest is named too
    (ckpt / "trainer_state.json").write_text('{"format_version": 3, "fil')
    with pytest.raises(CheckpointError, match=r"trainer_state\.json is damaged"):
        trainer.load_checkpoint(ckpt)


KILLED_RESAVE = """
import os, signal, sys, torch
import cmlrl_agents.runs.checkpoint as ck
root = sys.argv[1]
model = torch.nn.Linear(4, 4)
ck.save_checkpoint(root, 1, models={"m": model}, trainer_state={"v": "old"}, keep_last=1)
real = os.replace
def replace(src, dst):
    real(src, dst)
    if ".old-" in str(dst):  # the first of the two renames of a replacement: die right here
        os.kill(os.getpid(), signal.SIGKILL)
ck.os.replace = replace
ck.save_checkpoint(root, 1, models={"m": model}, trainer_state={"v": "new"}, keep_last=1)
"""


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_a_kill_while_replacing_the_only_checkpoint_loses_nothing(tmp_path):
    root = tmp_path / "ckpt"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_RESAVE, str(root)], env=env, timeout=120, check=False
    )
    assert proc.returncode == -signal.SIGKILL
    assert not (root / "checkpoint-1").exists()  # the window the kill hit
    assert latest_checkpoint(root) == root / "checkpoint-1"  # put back
    state = load_checkpoint(root / "checkpoint-1", models={"m": torch.nn.Linear(4, 4)})
    assert state == {"v": "old"}


# ------------------------------------------------------- 12: settings read once say so
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("num_turns", 2),
        ("early_termination_threshold", 0.5),
        ("output_dir", "elsewhere"),
        ("num_agents", 3),
        ("agent_devices", "cpu"),
        ("reference_kl_enabled", True),
    ],
)
def test_fields_read_at_construction_refuse_a_new_value(tmp_path, field, value):
    trainer = make(tmp_path / "run")
    old = getattr(trainer.args, field)
    with pytest.raises(AttributeError, match=f"args.{field} cannot change after MAGRPOTrainer"):
        setattr(trainer.args, field, value)
    assert getattr(trainer.args, field) == old
    setattr(trainer.args, field, old)  # the same value is fine
    with pytest.raises(AttributeError, match=f"change {field}"):
        trainer.args = MAGRPOConfig(**{**trainer.args.to_dict(), field: value})


def test_a_copy_of_a_trainers_config_is_free_to_change(tmp_path):
    import copy
    import pickle

    trainer = make(tmp_path / "run")
    for clone in (copy.deepcopy(trainer.args), pickle.loads(pickle.dumps(trainer.args))):
        clone.num_turns = 2
        assert clone.num_turns == 2 and trainer.args.num_turns is None
        with pytest.raises(ValueError, match="top_p"):
            clone.top_p = 2.0  # still validated


def test_logging_steps_and_learning_rate_changed_after_construction_take_effect(tmp_path):
    trainer = make(tmp_path / "run")
    trainer.args.logging_steps = 8
    trainer.args.agent_learning_rate = 2e-4
    trainer.train()
    train_entries = [m for _, m in trainer.logger.history if "loss" in m]
    assert len(train_entries) == 1  # two rounds (env_step 4 and 8) averaged into one entry
    assert trainer.logger.history[-1][0] == 8
    assert {g["lr"] for o in trainer.optimizers for g in o.param_groups} == {2e-4}


# --------------------------------------------------------------------------- 19: secrets
ISSUE_KEYS = (
    *("api-key", "x-api-key", "ApiToken", "access_key", "private_key", "openai_key"),
    *("hf_tokens", "bearer", "auth", "passphrase", "github_pat"),
)
SECRET_VALUES = (
    "sk-proj-abcdefghijklmnop1234",
    "hf_abcdefghijklmnopqrstuvwxyz12",
    "ghp_abcdefghijklmnopqrstuvwxyz0123",
)


@pytest.mark.parametrize("key", ISSUE_KEYS)
def test_secret_key_names_from_the_issue(key):
    assert is_secret_key(key)


@pytest.mark.parametrize(
    "key",
    ["max_new_tokens", "pad_token_id", "eos_token", "tokenizer", "num_tokens", "top_k", "author"],
)
def test_harmless_key_names_stay(key):
    assert not is_secret_key(key)


def test_secret_values_under_harmless_keys_are_replaced():
    assert all(is_secret_value(v) for v in SECRET_VALUES)
    assert redact_secrets({"note": f"key is {SECRET_VALUES[0]}", "n": 3, "l": ["ok"]}) == {
        "note": REDACTED,
        "n": 3,
        "l": ["ok"],
    }


def test_no_secret_reaches_any_file_the_library_writes(tmp_path):
    sections = {"service": {k: f"plain-{i}-secret" for i, k in enumerate(ISSUE_KEYS)}}
    sections["notes"] = {f"n{i}": v for i, v in enumerate(SECRET_VALUES)}
    sections["output"] = {"verbose": False}
    trainer = MAGRPOTrainer(
        agents=[tiny_agent(0), tiny_agent(1)],
        formatters=[tasks.brief_formatter, tasks.detailed_formatter],
        reward_func=tasks.length_ratio_reward,
        train_dataset=tasks.length_ratio_dataset().select(range(2)),
        args=MAGRPOConfig(
            num_generations=2,
            max_new_tokens=3,
            rollout_buffer_size=2,
            eval_interval=0,
            save_steps=2,
            output_dir=str(tmp_path / "run"),
        ),
        wandb_config={
            "mode": "offline",
            "dir": str(tmp_path / "wandb"),
            "tags": ["fine", SECRET_VALUES[1]],
            "config_sections": sections,
        },
    )
    trainer.train()
    trainer.close()
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.suffix == ".wandb" for p in files) and any(p.name == "config.json" for p in files)
    for path in files:
        data = path.read_bytes()
        for secret in (*SECRET_VALUES, *(f"plain-{i}-secret" for i in range(len(ISSUE_KEYS)))):
            assert secret.encode() not in data, (path, secret)
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["notes"] == dict.fromkeys(("n0", "n1", "n2"), REDACTED)
    assert config["service"] == {}


# -------------------------------------------------------------------------------- 20: CLI
def run_cli(capsys, *argv) -> tuple[int, str]:
    code = main([str(a) for a in argv])
    return code, capsys.readouterr().err


def test_cli_resume_from_a_missing_checkpoint_exits_2_before_loading_models(tmp_path, capsys):
    # The model does not exist: reaching the loader would fail with a different error.
    code, err = run_cli(
        capsys,
        "train",
        TINY_RUN,
        "--set",
        "model=no-such-org/no-such-model",
        "--resume",
        tmp_path / "missing",
    )
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "--resume" in err and "no checkpoint there" in err


def test_cli_refuses_a_key_given_twice(tmp_path, capsys):
    run_file = tmp_path / "run.yaml"
    run_file.write_text(
        TINY_RUN.read_text() + "\nconfig:\n  seed: 1\n", encoding="utf-8"
    )  # a second `config:` section
    code, err = run_cli(capsys, "check", run_file)
    assert code == 2 and "given twice" in err and "'config'" in err
    nested = tmp_path / "nested.yaml"
    nested.write_text("algorithm: magrpo\nconfig:\n  seed: 1\n  seed: 2\n", encoding="utf-8")
    code, err = run_cli(capsys, "check", nested)
    assert code == 2 and "the key 'seed' is given twice (lines 3 and 4)" in err


def test_cli_refuses_a_fresh_run_over_an_earlier_one(saved_run, tmp_path, capsys):
    import shutil

    out = tmp_path / "run"
    shutil.copytree(saved_run, out)
    code, err = run_cli(
        capsys, "train", TINY_RUN, "--set", f"config.output_dir={out}", "--set", "model=no/such"
    )
    assert code == 2 and "--resume latest" in err and "overwrite_output_dir" in err
