"""The run file's ``peft`` section: adapter agents from YAML, end to end on tiny models."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import yaml
from peft import LoraConfig, PeftModel
from safetensors.torch import load_file

from cmlrl_agents.cli.adapters import load_adapter_folders
from cmlrl_agents.cli.commands import main
from cmlrl_agents.cli.plan import build_trainer, plan
from cmlrl_agents.cli.spec import CLIError
from cmlrl_agents.tiny_models import tiny_model, tiny_tokenizer

LORA = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]}


def run_file(folder: Path, peft, algorithm: str = "magrpo", **config) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    spec = {
        "algorithm": algorithm,
        "model": "tiny",
        "task": {"name": "length_ratio", "max_train_items": 2},
        "config": {
            "num_agents": 2,
            "num_generations": 2,
            "max_new_tokens": 4,
            "rollout_buffer_size": 2,
            "agent_learning_rate": 1e-2,
            "eval_interval": 0,
            "eval_num_samples": 1,
            "seed": 0,
            "save_steps": 2,
            "output_dir": str(folder / "run"),
            "verbose": False,
            **config,
        },
        "peft": peft,
    }
    path = folder / "run.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_train_with_a_peft_section_saves_adapters_only(tmp_path, capsys) -> None:
    path = run_file(tmp_path, LORA)
    assert main(["check", str(path)]) == 0
    assert (
        "peft: adapter agents on one frozen base; every agent: LoraConfig(r=4, lora_alpha=8, "
        "lora_dropout=0.0, target_modules=['q_proj', 'v_proj'])"
    ) in capsys.readouterr().out
    assert main(["train", str(path)]) == 0
    run = tmp_path / "run"
    tokenizer = tiny_tokenizer()
    for i in (0, 1):
        folder = run / "model" / f"agent_{i}"
        assert (folder / "adapter_config.json").is_file()
        assert not (folder / "model.safetensors").exists() and not (folder / "config.json").exists()
        adapter = load_file(str(folder / "adapter_model.safetensors"))
        assert len(adapter) == 8 and all("lora_" in key for key in adapter)
        assert any(bool(t.abs().sum() > 0) for k, t in adapter.items() if "lora_B" in k)  # trained
        loaded = PeftModel.from_pretrained(tiny_model(len(tokenizer), 0), folder)
        assert loaded.peft_config["default"].r == 4
    # One shared base: the checkpoint holds both agents' adapters and nothing of the base.
    saved = load_file(str(run / "checkpoints" / "checkpoint-2" / "model-shared_base_0.safetensors"))
    assert saved and all("lora_" in key for key in saved)
    assert {key.split("/")[0] for key in saved} == {"agent_0", "agent_1"}
    assert main(["eval", str(path), "--checkpoint", "latest"]) == 0
    assert main(["eval", str(path), "--checkpoint", str(run / "model")]) == 0
    # The saved adapters load into a team built from the run file, tensor for tensor.
    trainer = build_trainer(plan(yaml.safe_load(path.read_text())), use_wandb=False)
    folders = [run / "model" / f"agent_{i}" for i in (0, 1)]
    load_adapter_folders(trainer.agents, folders)
    for agent, folder in zip(trainer.agents, folders, strict=True):
        saved = load_file(str(folder / "adapter_model.safetensors"))
        mine = {n: p for n, p in agent.model.named_parameters() if f".{agent.adapter}." in n}
        assert len(mine) == len(saved) == 8
        for name, tensor in saved.items():
            key = name.replace(".weight", f".{agent.adapter}.weight")
            assert torch.equal(mine[key], tensor), name
    trainer.close()
    capsys.readouterr()
    no_peft = run_file(tmp_path / "plain", None, output_dir=str(run))
    assert main(["eval", str(no_peft), "--checkpoint", str(run / "model")]) == 2
    assert "holds adapters (save_model of adapter agents)" in capsys.readouterr().err
    other_rank = run_file(tmp_path / "rank", {**LORA, "r": 8}, output_dir=str(run))
    assert main(["eval", str(other_rank), "--checkpoint", str(run / "model")]) == 2
    err = capsys.readouterr().err
    assert "does not fit adapter agent_0 of the run file's peft section" in err
    assert "adapter_config.json" in err and "Traceback" not in err


def test_a_list_gives_one_adapter_config_per_agent(tmp_path) -> None:
    second = {"r": 2, "lora_alpha": 4, "target_modules": ["k_proj"]}
    p = plan(
        yaml.safe_load(
            run_file(
                tmp_path, [LORA, second], algorithm="iac", use_separate_critic=False
            ).read_text()
        )
    )
    assert [c.r for c in p.peft] == [4, 2] and all(isinstance(c, LoraConfig) for c in p.peft)
    trainer = build_trainer(p, use_wandb=False)
    model = trainer.agents[0].model
    assert trainer.agents[1].model is model  # `tiny` with adapters: one base for the team
    shapes = {n: tuple(t.shape) for n, t in model.named_parameters() if ".agent_1." in n}
    assert all("k_proj" in n for n in shapes) and {
        s for n, s in shapes.items() if "lora_A" in n
    } == {(2, 32)}
    trainer.close()


@pytest.mark.parametrize(
    ("peft", "message"),
    [
        ({**LORA, "rank": 4}, r"unknown peft field \(of LoraConfig\) in run.yaml 'rank'"),
        ({**LORA, "lora_alph": 4}, r"'lora_alph' \(did you mean 'lora_alpha'\?\)"),
        ([LORA, {**LORA, "bias": 1, "dropout": 0}], r"unknown peft\[1\] field .* 'dropout'"),
        ([LORA] * 3, r"peft in run.yaml lists 3 adapter configs for 2 agents"),
        ({**LORA, "r": 0}, r"peft.r in run.yaml must be a positive int .*got 0"),
        ({**LORA, "lora_dropout": 1.5}, r"peft.lora_dropout in run.yaml must be in \[0, 1\)"),
        ("lora", r"peft in run.yaml must be a mapping of LoraConfig fields"),
    ],
)
def test_bad_peft_sections_name_the_field_and_the_file(tmp_path, peft, message) -> None:
    spec = yaml.safe_load(run_file(tmp_path, peft).read_text())
    with pytest.raises(CLIError, match=message):
        plan(spec, source="run.yaml")


def test_peft_errors_stop_the_command_before_a_model_loads(tmp_path, capsys) -> None:
    path = run_file(tmp_path, {**LORA, "rank": 4})
    assert main(["train", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"unknown peft field (of LoraConfig) in {path} 'rank'" in err
    assert not (tmp_path / "run").exists()


def test_without_a_peft_section_agents_are_full_models(tmp_path) -> None:
    p = plan(yaml.safe_load(run_file(tmp_path, None).read_text()))
    trainer = build_trainer(p, use_wandb=False)
    assert p.peft is None and all(a.adapter is None for a in trainer.agents)
    assert trainer.agents[0].model is not trainer.agents[1].model
    trainer.close()


def test_the_documented_peft_section_plans_as_written() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "experiments.md").read_text()
    blocks = re.findall(r"^```yaml\n(.*?)^```$", doc, flags=re.S | re.M)
    spec = yaml.safe_load(next(b for b in blocks if b.startswith("model: smollm2")))
    p = plan({**spec, "model": "tiny"}, source="the doc")
    assert (p.peft.r, p.peft.lora_alpha, sorted(p.peft.target_modules)) == (
        8,
        16,
        ["q_proj", "v_proj"],
    )
