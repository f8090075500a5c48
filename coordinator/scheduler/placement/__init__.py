"""The production placement engine: the policies' filter and rank over numpy columns, with the
allocator's GPU choice, making the same choices as the literal transcription of Alg. 1-3.
"""

from __future__ import annotations

from coordinator.scheduler.placement.engine import PlacementEngine

__all__ = ["PlacementEngine"]
