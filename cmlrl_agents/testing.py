"""Test helpers. The tiny offline models live in :mod:`cmlrl_agents.tiny_models` (the CLI and the
examples import them from there, so no library code imports a testing module); they are
re-exported here for the tests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cmlrl_agents.tiny_models import (
    TINY_CHAT_TEMPLATE,
    TINY_EOS_ID,
    tiny_agent,
    tiny_model,
    tiny_reward_model,
    tiny_tokenizer,
)

__all__ = [
    "SyncRecorder",
    "TINY_CHAT_TEMPLATE",
    "TINY_EOS_ID",
    "tiny_agent",
    "tiny_model",
    "tiny_reward_model",
    "tiny_tokenizer",
]


class SyncRecorder:
    """A ``GenerationBackend`` around ``inner`` that records, for each ``generate`` call, how
    many ``sync`` calls came before it: a backend that holds weights of its own (vLLM) serves
    those of its last sync, so a call at 0 syncs after an update samples the old policy."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.syncs = inner, 0
        self.calls: list[int] = []
        """The sync count at each generate call, in order."""

    def generate(self, agents: Sequence[Any], requests: Sequence[Any]) -> list[Any]:
        self.calls.append(self.syncs)
        return self.inner.generate(agents, requests)

    def sync(self, agents: Sequence[Any]) -> None:
        self.syncs += 1
        self.inner.sync(agents)
