"""The coordinator's version, reported by ``GetClusterStatus``."""

from __future__ import annotations

__all__ = ["VERSION"]

VERSION = "0.1.0"
