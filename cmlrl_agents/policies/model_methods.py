"""The optional Hugging Face and PEFT methods of a model held as an ``nn.Module``.

Agents, critics and reward models take any ``nn.Module``: a transformers model adds
``get_input_embeddings`` and ``get_output_embeddings``, a PEFT wrapper ``get_base_model``. They
are looked up, not assumed (and ``nn.Module.__getattr__`` types every other attribute as
``Tensor | Module``).
"""

from __future__ import annotations

from torch import nn

__all__ = ["base_model", "input_embeddings", "output_embeddings"]


def base_model(model: nn.Module) -> nn.Module:
    """The model a PEFT wrapper wraps (``get_base_model()``), else ``model`` itself."""
    get_base = getattr(model, "get_base_model", None)
    return model if get_base is None else get_base()


def input_embeddings(model: nn.Module) -> nn.Module | None:
    """``model.get_input_embeddings()``, or None for a model without the method."""
    get = getattr(model, "get_input_embeddings", None)
    return None if get is None else get()


def output_embeddings(model: nn.Module) -> nn.Module | None:
    """``model.get_output_embeddings()`` (the output layer), or None for a model without the
    method or without such a layer."""
    get = getattr(model, "get_output_embeddings", None)
    return None if get is None else get()
