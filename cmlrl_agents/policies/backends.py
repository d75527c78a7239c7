"""The generation backend a config names (``generation_backend``): transformers' ``generate``
(:class:`~cmlrl_agents.policies.generation.HFGenerate`), the same on bfloat16 copies of the
agents (:class:`~cmlrl_agents.policies.bf16_backend.BF16Generate`), or vLLM's, whose module (and
vLLM) is imported only when it is chosen."""

from __future__ import annotations

from cmlrl_agents.policies.generation import GenerationBackend, HFGenerate

__all__ = ["BACKENDS", "make_backend"]

BACKENDS = ("hf", "hf_bf16", "vllm")


def make_backend(name: str) -> GenerationBackend:
    """The backend a config names: "hf" (default), "hf_bf16" or "vllm" (imports vLLM only
    now)."""
    if name == "hf":
        return HFGenerate()
    if name == "hf_bf16":
        from cmlrl_agents.policies.bf16_backend import BF16Generate

        return BF16Generate()
    if name == "vllm":
        from cmlrl_agents.policies.vllm_backend import VLLMGenerate

        return VLLMGenerate()
    raise ValueError(f"generation_backend must be one of {BACKENDS}, got {name!r}.")
