"""Checks of command-line options that several benchmark scripts share."""

from __future__ import annotations

import argparse
from collections.abc import Iterable


def refuse_below_one(
    parser: argparse.ArgumentParser, args: argparse.Namespace, names: Iterable[str]
) -> None:
    """Exit through ``parser.error`` naming the first count of ``names`` (``args`` attributes,
    given as ``--name``) that is below 1, with its value."""
    for name in names:
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, got {getattr(args, name)}")
