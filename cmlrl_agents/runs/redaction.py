"""Keeping credentials out of every file the library writes (config.json, checkpoints, W&B).

Two tests, because a run config carries secrets in two ways: under a key that names one
(``api_key``, ``x-api-key``, ``ApiToken``, ``hf_tokens``, ``github_pat``, ...), whose entry is
dropped, and as a value that looks like one under a harmless key (``"url": "...?sk-..."``,
``"note": "hf_..."``), which is replaced by ``REDACTED``. Key names are split into words (at
``_``, ``-``, ``.``, spaces and camelCase) so that spelling does not matter; a word test rather
than a substring test keeps ``max_new_tokens``, ``pad_token_id`` and ``tokenizer`` (bug B22 of
the reference wrote such secrets into its checkpoints).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["REDACTED", "is_secret_key", "is_secret_value", "redact_secrets"]

REDACTED = "<redacted>"

# Words that make a key secret wherever they appear in it.
_SECRET_WORDS = frozenset(
    {"secret", "password", "passwd", "passphrase", "credential", "credentials", "bearer"}
    | {"authorization", "auth", "apikey", "apitoken", "pat"}
)
# Adjacent word pairs that do.
_SECRET_PAIRS = frozenset(
    {("api", "key"), ("api", "token"), ("private", "key"), ("access", "key"), ("secret", "key")}
)
# As the last word, "token(s)" and "key" mean a credential unless the word before says the key
# counts tokens (max_new_tokens), names a tokenizer token (pad_token) or indexes a mapping.
_LAST_WORDS = frozenset({"token", "tokens", "key", "keys"})
_HARMLESS_BEFORE = frozenset(
    {"new", "max", "min", "num", "total", "prompt", "completion", "special", "added", "extra"}
    | {"bos", "eos", "pad", "unk", "sep", "cls", "mask", "additional", "start", "end", "stop"}
    | {"sort", "state", "cache", "dict", "group", "metric", "primary", "column", "lookup"}
    | {"item", "text", "prompt", "answer", "label", "id", "hash", "reward", "dataset"}
)
_HARMLESS_AFTER = frozenset({"id", "ids", "count", "counts", "length", "len", "limit"})

# Values with the shape of well-known credentials: OpenAI/Anthropic (sk-), Hugging Face (hf_),
# GitHub (ghp_/gho_/ghu_/ghs_/ghr_/github_pat_), Slack (xox?-), AWS access key ids (AKIA), W&B
# v1 keys, JWT-like bearer headers and PEM private keys.
_SECRET_VALUE = re.compile(
    r"(?<![A-Za-z0-9])(?:"
    r"sk-[A-Za-z0-9_-]{16,}"
    r"|hf_[A-Za-z0-9]{20,}"
    r"|gh[pousr]_[A-Za-z0-9]{20,}"
    r"|github_pat_[A-Za-z0-9_]{20,}"
    r"|xox[abposr]-[A-Za-z0-9-]{10,}"
    r"|AKIA[0-9A-Z]{16}"
    r"|local-[0-9a-f]{40}"
    r")"
    r"|[Bb]earer\s+[A-Za-z0-9._~+/-]{16,}"
    r"|-----BEGIN [A-Z ]*PRIVATE KEY-----"
)


def _words(key: str) -> list[str]:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", key)
    spaced = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1 \2", spaced)
    return [w for w in re.split(r"[^a-z0-9]+", spaced.lower()) if w]


def is_secret_key(key: str) -> bool:
    """Whether a config key looks like it holds a credential (API key, token, password)."""
    words = _words(key)
    if not words:
        return False
    if any(w in _SECRET_WORDS for w in words) or any(
        pair in _SECRET_PAIRS for pair in zip(words, words[1:], strict=False)
    ):
        return True
    if "".join(words).endswith(("apikey", "accesskey", "privatekey")):
        return True
    # "token"/"key" as the last word ("pad_token_id" ends in "id": a number, not a secret).
    if words[-1] in _HARMLESS_AFTER or words[-1] not in _LAST_WORDS:
        return False
    return len(words) == 1 or words[-2] not in _HARMLESS_BEFORE


def is_secret_value(value: Any) -> bool:
    """Whether a string contains something shaped like a well-known credential."""
    return isinstance(value, str) and _SECRET_VALUE.search(value) is not None


def redact_secrets(obj: Any) -> Any:
    """A copy of ``obj`` without the mapping keys that :func:`is_secret_key` flags, and with
    :data:`REDACTED` for every string :func:`is_secret_value` flags, at any depth."""
    if isinstance(obj, Mapping):
        return {k: redact_secrets(v) for k, v in obj.items() if not is_secret_key(str(k))}
    if isinstance(obj, (list, tuple)):
        return [redact_secrets(v) for v in obj]
    if is_secret_value(obj):
        return REDACTED
    return obj
