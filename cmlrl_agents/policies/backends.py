"""The generation backend a config names (``generation_backend``): transformers' ``generate``
(:class:`~cmlrl_agents.policies.generation.HFGenerate`) or vLLM's, whose module (and vLLM) is
imported only when it is chosen."""

from __future__ import annotations

from cmlrl_agents.policies.generation import GenerationBackend, HFGenerate

__all__ = ["BACKENDS", "make_backend"]

BACKENDS = ("hf", "vllm")


def make_backend(name: str) -> GenerationBackend:
    """The backend a config names: "hf" (default) or "vllm" (imports vLLM only now)."""
    if name == "hf":
        return HFGenerate()
    if name == "vllm":
        from cmlrl_agents.policies.vllm_backend import VLLMGenerate

        return VLLMGenerate()
    raise ValueError(f"generation_backend must be one of {BACKENDS}, got {name!r}.")
