"""Checkpoints: exact round trip (weights, AdamW, scheduler, RNG), pruning, crash safety."""

from __future__ import annotations

import copy
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from cmlrl_agents.runs.checkpoint import (
    atomic_dir,
    is_secret_key,
    latest_checkpoint,
    load_checkpoint,
    redact_secrets,
    save_checkpoint,
)

REPO_ROOT = Path(__file__).resolve().parents[2]


class TinyLM(torch.nn.Module):
    """Embedding tied to the output head (like most small LLMs) plus a buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(11, 6)
        self.body = torch.nn.Linear(6, 6)
        self.head = torch.nn.Linear(6, 11, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("scale", torch.tensor(0.5))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.body(self.embed(ids))) * self.scale)


def make_parts(seed: int):
    torch.manual_seed(seed)
    model = TinyLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    return model, optimizer, scheduler


def train_step(model, optimizer, scheduler) -> None:
    ids = torch.randint(0, 11, (4, 3))
    loss = torch.nn.functional.cross_entropy(model(ids).flatten(0, 1), ids.flatten())
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    scheduler.step()


def draws() -> tuple:
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def assert_same_optimizer_state(a: dict, b: dict) -> None:
    assert a["param_groups"] == b["param_groups"]
    assert a["state"].keys() == b["state"].keys()
    for index, state in a["state"].items():
        for key, value in state.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(b["state"][index][key]))


def save_tiny(root: Path, step: int, model, optimizer, scheduler, **kwargs) -> Path:
    return save_checkpoint(
        root,
        step,
        models={"agent_0": model},
        optimizers={"agent_0": optimizer},
        schedulers={"agent_0": scheduler},
        **kwargs,
    )


def load_tiny(path: Path, model, optimizer, scheduler) -> dict:
    return load_checkpoint(
        path,
        models={"agent_0": model},
        optimizers={"agent_0": optimizer},
        schedulers={"agent_0": scheduler},
    )


def test_round_trip_restores_weights_optimizer_scheduler_rng_and_state(tmp_path):
    model, optimizer, scheduler = make_parts(0)
    train_step(model, optimizer, scheduler)
    trainer_state = {"env_step": 12, "item_index": 3, "history": [[4, {"r": 0.5}]], "t": (1, 2)}
    path = save_tiny(tmp_path, 12, model, optimizer, scheduler, trainer_state=trainer_state)
    assert path == tmp_path / "checkpoint-12"
    assert sorted(p.name for p in path.iterdir()) == [
        "model-agent_0.safetensors",
        "optim-agent_0.pt",
        "rng-rank0.pt",
        "sched-agent_0.pt",
        "trainer_state.json",
    ]
    params = {k: v.clone() for k, v in model.state_dict().items()}
    optim_state = copy.deepcopy(optimizer.state_dict())  # state_dict() aliases live tensors
    sched_state = copy.deepcopy(scheduler.state_dict())
    expected_draws = draws()

    # Drift everything, then load into freshly built (differently initialised) objects.
    train_step(model, optimizer, scheduler)
    model2, optimizer2, scheduler2 = make_parts(1)
    restored = load_tiny(path, model2, optimizer2, scheduler2)

    assert restored == {**trainer_state, "t": [1, 2]}
    for key, value in model2.state_dict().items():
        assert torch.equal(value, params[key]), key
    assert model2.head.weight is model2.embed.weight  # still tied
    assert_same_optimizer_state(optimizer2.state_dict(), optim_state)
    assert scheduler2.state_dict() == sched_state
    assert draws() == expected_draws

    # The restored objects train on exactly as the originals would have.
    reference, ref_optimizer, ref_scheduler = make_parts(1)
    load_tiny(path, reference, ref_optimizer, ref_scheduler)
    train_step(reference, ref_optimizer, ref_scheduler)
    load_tiny(path, model2, optimizer2, scheduler2)
    train_step(model2, optimizer2, scheduler2)
    for key, value in model2.state_dict().items():
        assert torch.equal(value, reference.state_dict()[key]), key


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_round_trip_on_cuda_restores_the_cuda_rng(tmp_path):
    model, _, _ = make_parts(0)
    model = model.cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    ids = torch.randint(0, 11, (4, 3), device="cuda")
    model(ids).sum().backward()
    optimizer.step()
    path = save_tiny(tmp_path, 1, model, optimizer, scheduler)
    expected = torch.rand(4, device="cuda").tolist()
    params = {k: v.clone() for k, v in model.state_dict().items()}
    model2, _, _ = make_parts(1)
    model2 = model2.cuda()
    optimizer2 = torch.optim.AdamW(model2.parameters(), lr=1e-2)
    scheduler2 = torch.optim.lr_scheduler.StepLR(optimizer2, step_size=1)
    load_tiny(path, model2, optimizer2, scheduler2)
    assert torch.rand(4, device="cuda").tolist() == expected
    assert all(torch.equal(v, params[k]) for k, v in model2.state_dict().items())
    exp_avg = next(iter(optimizer2.state_dict()["state"].values()))["exp_avg"]
    assert exp_avg.device.type == "cuda"


def test_secrets_are_not_written(tmp_path):
    model, optimizer, scheduler = make_parts(0)
    state = {
        "config": {"comparator_api_key": "sk-123", "hf_token": "hf_x", "max_new_tokens": 8},
        "wandb": {"password": "pw", "project": "p"},
    }
    path = save_tiny(tmp_path, 1, model, optimizer, scheduler, trainer_state=state)
    text = (path / "trainer_state.json").read_text()
    assert "sk-123" not in text and "hf_x" not in text and "pw" not in text
    restored = load_tiny(path, model, optimizer, scheduler)
    assert restored == {"config": {"max_new_tokens": 8}, "wandb": {"project": "p"}}


@pytest.mark.parametrize(
    ("key", "secret"),
    [
        ("api_key", True),
        ("OPENAI_API_KEY", True),
        ("hf_token", True),
        ("token", True),
        ("client_secret", True),
        ("db_password", True),
        ("max_new_tokens", False),
        ("pad_token", False),
        ("pad_token_id", False),
        ("tokenizer", False),
        ("num_tokens", False),
    ],
)
def test_is_secret_key(key, secret):
    assert is_secret_key(key) is secret


def test_redact_secrets_goes_into_lists():
    assert redact_secrets({"a": [{"token": "x", "b": 1}]}) == {"a": [{"b": 1}]}


def test_keep_last_prunes_the_oldest_but_never_the_checkpoint_just_written(tmp_path):
    model, optimizer, scheduler = make_parts(0)
    for step in (1, 2, 3, 4):
        save_tiny(tmp_path, step, model, optimizer, scheduler, keep_last=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-3", "checkpoint-4"]
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoint-4"
    # Resumed from an older checkpoint: the new save survives although a larger number exists.
    save_tiny(tmp_path, 2, model, optimizer, scheduler, keep_last=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-2", "checkpoint-4"]


def test_saving_the_same_step_again_replaces_it(tmp_path):
    model, optimizer, scheduler = make_parts(0)
    save_tiny(tmp_path, 5, model, optimizer, scheduler, trainer_state={"v": 1})
    save_tiny(tmp_path, 5, model, optimizer, scheduler, trainer_state={"v": 2})
    assert load_tiny(tmp_path / "checkpoint-5", model, optimizer, scheduler) == {"v": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint-5"]


def test_latest_checkpoint_ignores_incomplete_and_foreign_folders(tmp_path):
    assert latest_checkpoint(tmp_path / "missing") is None
    assert latest_checkpoint(tmp_path) is None
    model, optimizer, scheduler = make_parts(0)
    save_tiny(tmp_path, 3, model, optimizer, scheduler)
    (tmp_path / "checkpoint-9").mkdir()  # no trainer_state.json: not complete
    (tmp_path / ".checkpoint-10.tmp-1-x").mkdir()
    (tmp_path / "checkpoint-final").mkdir()
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoint-3"


def test_atomic_dir_leaves_the_previous_content_when_the_body_raises(tmp_path):
    final = tmp_path / "out"
    with atomic_dir(final) as tmp:
        (tmp / "a.txt").write_text("old")
    with pytest.raises(RuntimeError, match="boom"), atomic_dir(final) as tmp:
        (tmp / "a.txt").write_text("new")
        raise RuntimeError("boom")
    assert (final / "a.txt").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


class ExplodingOptimizer(torch.optim.SGD):
    def state_dict(self):
        raise RuntimeError("disk full")


def test_a_failing_save_keeps_the_previous_checkpoint_and_leaves_no_new_one(tmp_path):
    model, optimizer, scheduler = make_parts(0)
    train_step(model, optimizer, scheduler)
    save_tiny(tmp_path, 1, model, optimizer, scheduler, trainer_state={"step": 1})
    bad = ExplodingOptimizer(model.parameters(), lr=0.1)
    with pytest.raises(RuntimeError, match="disk full"):
        save_checkpoint(tmp_path, 2, models={"agent_0": model}, optimizers={"agent_0": bad})
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint-1"]
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoint-1"
    assert load_tiny(tmp_path / "checkpoint-1", *make_parts(1)) == {"step": 1}


KILLED_SAVE = """
import sys, time
from pathlib import Path
import torch
from cmlrl_agents.runs.checkpoint import save_checkpoint

root, ready = Path(sys.argv[1]), Path(sys.argv[2])
model = torch.nn.Linear(64, 64)

class Stalling(torch.optim.SGD):
    def state_dict(self):
        ready.write_text("mid-save")  # the model file of checkpoint-2 is already written
        time.sleep(120)
        return super().state_dict()

save_checkpoint(root, 1, models={"m": model}, optimizers={"m": torch.optim.SGD(model.parameters())},
                trainer_state={"step": 1})
save_checkpoint(root, 2, models={"m": model}, optimizers={"m": Stalling(model.parameters())},
                trainer_state={"step": 2})
"""


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_sigkill_during_a_save_leaves_the_previous_checkpoint_loadable(tmp_path):
    root, ready = tmp_path / "ckpt", tmp_path / "ready"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    process = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(KILLED_SAVE), str(root), str(ready)], env=env
    )
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert process.poll() is None, "the saving process ended early"
            assert time.monotonic() < deadline, "the saving process never reached mid-save"
            time.sleep(0.05)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    leftovers = [p.name for p in root.iterdir() if p.name.startswith(".")]
    assert len(leftovers) == 1 and leftovers[0].startswith(".checkpoint-2.tmp-")
    assert latest_checkpoint(root) == root / "checkpoint-1"
    model = torch.nn.Linear(64, 64)
    optimizer = torch.optim.SGD(model.parameters())
    state = load_checkpoint(root / "checkpoint-1", models={"m": model}, optimizers={"m": optimizer})
    assert state == {"step": 1}
    # The next save clears what the dead process left behind.
    save_checkpoint(root, 2, models={"m": model}, optimizers={"m": optimizer})
    assert sorted(p.name for p in root.iterdir()) == ["checkpoint-1", "checkpoint-2"]


def test_peft_models_save_only_adapter_weights_and_round_trip(tmp_path):
    peft = pytest.importorskip("peft")
    from safetensors.torch import load_file

    def make(seed: int):
        torch.manual_seed(seed)
        base = torch.nn.Sequential()
        base.add_module("proj", torch.nn.Linear(8, 8))
        base.add_module("out", torch.nn.Linear(8, 4))
        config = peft.LoraConfig(r=2, target_modules=["proj"], init_lora_weights=False)
        model = peft.get_peft_model(base, config, adapter_name="agent_0")
        model.add_adapter("agent_1", config)
        return model

    model = make(0)
    path = save_checkpoint(tmp_path, 1, models={"team": model})
    keys = load_file(path / "model-team.safetensors").keys()
    assert keys and all("lora_" in key for key in keys)
    assert {key.split("/")[0] for key in keys} == {"agent_0", "agent_1"}

    other = make(1)
    load_checkpoint(path, models={"team": other})
    for name, value in model.state_dict().items():
        if "lora_" in name:
            assert torch.equal(value, other.state_dict()[name]), name

    with pytest.raises(ValueError, match="PEFT adapter weights"):
        load_checkpoint(path, models={"team": torch.nn.Linear(8, 8)})


def test_bad_arguments_get_clear_errors(tmp_path):
    model, optimizer, scheduler = make_parts(0)
    with pytest.raises(ValueError, match="step_name must be a non-negative int"):
        save_checkpoint(tmp_path, "final", models={"m": model})
    with pytest.raises(ValueError, match="keep_last must be None"):
        save_checkpoint(tmp_path, 1, models={"m": model}, keep_last=0)
    with pytest.raises(ValueError, match="not a valid file-name part"):
        save_checkpoint(tmp_path, 1, models={"agent 0": model})
    with pytest.raises(TypeError, match=r"trainer_state\['reward'\] is a function"):
        save_checkpoint(tmp_path, 1, models={"m": model}, trainer_state={"reward": lambda x: x})
    with pytest.raises(TypeError, match="JSON keys are str"):
        save_checkpoint(tmp_path, 1, models={"m": model}, trainer_state={"h": {0: 1.0}})
    assert not tmp_path.exists() or list(tmp_path.iterdir()) == []

    path = save_checkpoint(tmp_path, 1, models={"m": model}, optimizers={"m": optimizer})
    with pytest.raises(ValueError, match=r"optimizers names \[\] do not match .*\['m'\]"):
        load_checkpoint(path, models={"m": model})
    with pytest.raises(FileNotFoundError, match="not a checkpoint folder"):
        load_checkpoint(tmp_path, models={"m": model})
    manifest = json.loads((path / "trainer_state.json").read_text())
    assert manifest["format_version"] == 3 and manifest["models"] == {"m": "full"}
