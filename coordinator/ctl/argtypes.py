"""argparse types for gptrmctl's numeric flags: a bad value is a usage error naming the range."""

from __future__ import annotations

import argparse
from collections.abc import Callable

__all__ = ["gpu_ref", "int_between"]


def int_between(lo: int, hi: int, *, unit: str = "", why: str = "") -> Callable[[str], int]:
    """An argparse type: a whole number (of ``unit``) in ``[lo, hi]``; ``why`` follows the range in the message."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number{f' of {unit}' if unit else ''}, "
                                             f"got {text[:64]!r}") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"must be between {lo} and {hi}{why}, got {text[:64]}")
        return value
    return parse


def gpu_ref(text: str) -> tuple[str, list[int]]:
    """An argparse type: ``NODE`` (every fenced GPU of the node) or ``NODE:INDEX[,INDEX...]``."""
    node, colon, indices = text.rpartition(":")
    if not colon:
        node, indices = text, ""
    if not node:
        raise argparse.ArgumentTypeError(f"expected NODE or NODE:INDEX[,INDEX], got {text[:64]!r}")
    out: list[int] = []
    for part in indices.split(",") if colon else ():
        if not part.strip().isdigit():
            raise argparse.ArgumentTypeError(f"GPU index {part[:16]!r} in {text[:64]!r} is not a whole number ≥ 0")
        out.append(int(part))
    return node, out
