"""What the guides say about disk and saved adapters holds: a full fine-tuning checkpoint takes
about 12 bytes per trained parameter, and a saved adapter records the local folder of its base."""

from __future__ import annotations

import json
from pathlib import Path

from datasets import Dataset
from peft import LoraConfig

from cmlrl_agents import MAGRPOConfig, MAGRPOTrainer
from cmlrl_agents.testing import tiny_agent

ROOT = Path(__file__).resolve().parents[2]


def reward(a: list[str], b: list[str]) -> list[float]:
    return [float(len(x) < len(y)) for x, y in zip(a, b, strict=True)]


def config(out: Path) -> MAGRPOConfig:
    return MAGRPOConfig(
        num_generations=2, max_new_tokens=3, eval_interval=0, save_steps=2, output_dir=str(out)
    )


def test_a_checkpoint_takes_about_12_bytes_per_trained_parameter(tmp_path) -> None:
    agents = [tiny_agent(seed=0), tiny_agent(seed=1)]
    trained = sum(p.numel() for a in agents for p in a.model.parameters() if p.requires_grad)
    trainer = MAGRPOTrainer(
        agents=agents,
        reward_func=reward,
        train_dataset=Dataset.from_dict({"prompt": ["p0", "p1"]}),
        args=config(tmp_path / "run"),
    )
    trainer.train()
    (checkpoint,) = (tmp_path / "run" / "checkpoints").iterdir()
    weights = sum(f.stat().st_size for f in checkpoint.glob("model-*.safetensors"))
    optimizers = sum(f.stat().st_size for f in checkpoint.glob("optim-*.pt"))
    # float32 weights (4 bytes) and AdamW's two moments (8 bytes), plus headers
    assert 4.0 <= weights / trained < 4.2
    assert 8.0 <= optimizers / trained < 8.6
    text = " ".join((ROOT / "docs" / "experiments.md").read_text(encoding="utf-8").split())
    assert "about 12 bytes per trained parameter" in text


def test_a_saved_adapter_records_the_local_folder_of_its_base(base_folder, tmp_path) -> None:
    trainer = MAGRPOTrainer(
        agent_model=str(base_folder),
        num_agents=2,
        peft_config=LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"]),
        reward_func=reward,
        train_dataset=Dataset.from_dict({"prompt": ["p0", "p1"]}),
        args=config(tmp_path / "run"),
    )
    trainer.save_model(tmp_path / "saved")
    saved = json.loads((tmp_path / "saved" / "agent_1" / "adapter_config.json").read_text())
    assert saved["base_model_name_or_path"] == str(base_folder)  # a path, not a hub id
