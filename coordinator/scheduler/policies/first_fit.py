"""First-fit placement (baseline): the first feasible node in snapshot order.

Requests are taken in queue order; gangs take the first ``nodes`` feasible nodes. No scale-out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from coordinator.domain import NodeId, NodeSnapshot, Request
from coordinator.scheduler.policies.base import (
    DEFAULT_THRESHOLD,
    DEFAULT_THRESHOLD_MODE,
    BoolArray,
    IntArray,
    NodeArrays,
    PolicyArgs,
    ShapeIndex,
    ThresholdPolicy,
    feasible,
)

__all__ = ["NAME", "FirstFit", "FirstFitArgs", "build", "feasible", "first_k", "rank"]

NAME = "first-fit"


@dataclass(frozen=True, slots=True)
class FirstFitArgs(PolicyArgs):
    """Arguments of :class:`FirstFit` (``threshold`` in (0, 1], checked when built)."""


def first_k(mask: BoolArray, count: int) -> IntArray:
    """The first ``count`` feasible node indices in snapshot order.

    :param mask: which nodes are feasible.
    :param count: how many nodes are needed.
    :returns: up to ``count`` indices.
    """
    if count == 1:
        first = int(np.argmax(mask))
        return np.array([first] if mask[first] else [], dtype=np.int64)
    return np.flatnonzero(mask)[:count].astype(np.int64)


def rank(nodes: Sequence[NodeSnapshot]) -> list[NodeId]:
    """Node ids in snapshot order.

    :param nodes: the nodes in snapshot order.
    :returns: the order in which nodes are tried.
    """
    return [n.node_id for n in nodes]


class FirstFit(ThresholdPolicy):
    """First-fit as a :class:`~coordinator.scheduler.policies.base.Policy`.

    :param args: validated arguments.
    """

    name = NAME
    sorts_requests = False
    scale_out = False
    confirms_lazily = True
    reads_view = False

    def rank(self, req: Request, nodes: Sequence[NodeSnapshot]) -> list[NodeId]:
        """Rank: see :func:`rank`."""
        return rank(nodes)

    def select(self, view: NodeArrays, mask: BoolArray, req: Request) -> IntArray:
        """The first ``req.nodes`` feasible nodes."""
        return first_k(mask, req.nodes)

    def select_indexed(self, view: NodeArrays, entry: ShapeIndex, req: Request) -> IntArray:
        """:meth:`select`; for one node, the first that the entry confirms feasible now."""
        if req.nodes != 1:
            return self.select(view, entry.mask, req)
        i = self.select_one(view, entry, req)
        return np.array([i] if i >= 0 else [], dtype=np.int64)

    def select_one(self, view: NodeArrays, entry: ShapeIndex, req: Request) -> int:
        """The first node the entry confirms feasible now (-1: none)."""
        i = entry.first_from(0)
        while i >= 0 and not entry.confirm(i):
            i = entry.first_from(i + 1)   # nodes before i are refused (i now too)
        return i


def build(threshold: float = DEFAULT_THRESHOLD, *, seed: int | None = None,
          mode: str = DEFAULT_THRESHOLD_MODE) -> FirstFit:
    """Build the policy.

    :param threshold: cap on every dimension's utilization after placement, in (0, 1].
    :param mode: which dimensions the threshold caps (``whole-gpus`` or ``paper``).
    :param seed: ignored (every factory in the registry takes one, for the random policy).
    :returns: the policy.
    :raises ValidationError: on a threshold outside (0, 1].
    """
    return FirstFit(FirstFitArgs(threshold=threshold, threshold_mode=mode))
