"""Fixtures shared by the agent tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from cmlrl_agents.testing import tiny_model, tiny_tokenizer


@pytest.fixture
def base_folder(tmp_path: Path) -> Path:
    """A tiny base model saved as a local folder, so ``agent_model=`` names it (adapter agents
    need one base by name)."""
    tokenizer = tiny_tokenizer()
    folder = tmp_path / "base"
    tiny_model(len(tokenizer), 0).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
