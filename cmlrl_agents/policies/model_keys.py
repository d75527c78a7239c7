"""The keys of a trainer's ``model_config``, in a module that imports nothing heavy: the
``cmlrl`` command checks a run file's model section with them without loading torch."""

from __future__ import annotations

__all__ = ["MODEL_CONFIG_KEYS"]

MODEL_CONFIG_KEYS = (
    "dtype",
    "torch_dtype",
    "device",
    "gguf_file",
    "chat_template",
    "system_prompt",
    "model_kwargs",
    "cache_dir",
)
