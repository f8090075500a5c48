"""argparse types for gptrmctl's numeric flags: a bad value is a usage error naming the range."""

from __future__ import annotations

import argparse
from collections.abc import Callable

__all__ = ["int_between"]


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
