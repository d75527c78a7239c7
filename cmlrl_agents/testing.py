"""Test helpers. The tiny offline models live in :mod:`cmlrl_agents.tiny_models` (the CLI and the
examples import them from there, so no library code imports a testing module); they are
re-exported here for the tests."""

from __future__ import annotations

from cmlrl_agents.tiny_models import (
    TINY_CHAT_TEMPLATE,
    TINY_EOS_ID,
    tiny_agent,
    tiny_model,
    tiny_reward_model,
    tiny_tokenizer,
)

__all__ = [
    "TINY_CHAT_TEMPLATE",
    "TINY_EOS_ID",
    "tiny_agent",
    "tiny_model",
    "tiny_reward_model",
    "tiny_tokenizer",
]
