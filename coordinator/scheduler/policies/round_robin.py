"""Round-robin placement (baseline): the next feasible node after the last one used.

Requests are taken in queue order. A cursor walks the snapshot order; each request goes on the
first feasible node at or after the cursor (wrapping around), and the cursor moves just past
the last node chosen. Gangs take the next ``nodes`` feasible nodes. No scale-out.
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

__all__ = ["NAME", "RoundRobin", "RoundRobinArgs", "build", "feasible", "next_cursor", "rank", "rotate"]

NAME = "round-robin"


@dataclass(frozen=True, slots=True)
class RoundRobinArgs(PolicyArgs):
    """Arguments of :class:`RoundRobin` (``threshold`` in (0, 1], checked when built)."""


def rotate(mask: BoolArray, cursor: int, count: int) -> IntArray:
    """The first ``count`` feasible node indices at or after ``cursor``, wrapping around.

    :param mask: which nodes are feasible.
    :param cursor: where the walk starts.
    :param count: how many nodes are needed.
    :returns: up to ``count`` indices in walk order.
    """
    if count == 1:
        # argmax of a boolean slice is its first True: no list of every feasible node is built.
        for offset, part in ((cursor, mask[cursor:]), (0, mask[:cursor])):
            if len(part):
                k = int(part.argmax())
                if part[k]:
                    return np.array([offset + k], dtype=np.int64)
        return np.zeros(0, dtype=np.int64)
    candidates = np.flatnonzero(mask)
    start = int(np.searchsorted(candidates, cursor))
    return np.concatenate((candidates[start:], candidates[:start]))[:count].astype(np.int64)


def next_cursor(indices: IntArray, n_nodes: int) -> int:
    """Where the walk resumes after a placement: just past the last node chosen.

    :param indices: the nodes chosen, in walk order (not empty).
    :param n_nodes: number of nodes in the snapshot.
    :returns: the new cursor.
    """
    return (int(indices[-1]) + 1) % n_nodes


def rank(nodes: Sequence[NodeSnapshot], cursor: int) -> list[NodeId]:
    """Node ids in walk order from ``cursor``.

    :param nodes: the nodes in snapshot order.
    :param cursor: where the walk starts.
    :returns: the order in which nodes are tried.
    """
    return [n.node_id for n in (*nodes[cursor:], *nodes[:cursor])]


class RoundRobin(ThresholdPolicy):
    """Round-robin as a :class:`~coordinator.scheduler.policies.base.Policy`; the cursor is its only state.

    :param args: validated arguments.
    """

    name = NAME
    sorts_requests = False
    scale_out = False
    confirms_lazily = True
    reads_view = False

    def __init__(self, args: RoundRobinArgs) -> None:
        super().__init__(args)
        self.cursor = 0

    def rank(self, req: Request, nodes: Sequence[NodeSnapshot]) -> list[NodeId]:
        """Rank: see :func:`rank`."""
        return rank(nodes, self.cursor % max(len(nodes), 1))

    def select(self, view: NodeArrays, mask: BoolArray, req: Request) -> IntArray:
        """The next ``req.nodes`` feasible nodes from the cursor."""
        return rotate(mask, self.cursor, req.nodes)

    def select_indexed(self, view: NodeArrays, entry: ShapeIndex, req: Request) -> IntArray:
        """:meth:`select`; for one node, the next that the entry confirms feasible now."""
        if req.nodes != 1:
            return self.select(view, entry.mask, req)
        i = self.select_one(view, entry, req)
        return np.array([i] if i >= 0 else [], dtype=np.int64)

    def select_one(self, view: NodeArrays, entry: ShapeIndex, req: Request) -> int:
        """The next node from the cursor that the entry confirms feasible now (-1: none)."""
        # rotate(mask, cursor, 1) with each refused suspect dropped: from the cursor to the end, then from
        # the first node up to the cursor.
        cursor = self.cursor
        i = entry.first_from(cursor)
        while i >= 0 and not entry.confirm(i):
            i = entry.first_from(i + 1)
        if i < 0 and cursor > 0:
            i = entry.first_from(0, cursor)
            while i >= 0 and not entry.confirm(i):
                i = entry.first_from(i + 1, cursor)
        return i

    def committed(self, indices: IntArray, n_nodes: int) -> None:
        """Move the cursor past the last node chosen."""
        self.cursor = next_cursor(indices, n_nodes)

    def committed_one(self, i: int, n_nodes: int) -> None:
        """Move the cursor past node ``i`` (:func:`next_cursor` of ``[i]``)."""
        self.cursor = (i + 1) % n_nodes


def build(threshold: float = DEFAULT_THRESHOLD, *, seed: int | None = None,
          mode: str = DEFAULT_THRESHOLD_MODE) -> RoundRobin:
    """Build the policy (cursor at the first node).

    :param threshold: cap on every dimension's utilization after placement, in (0, 1].
    :param mode: which dimensions the threshold caps (``whole-gpus`` or ``paper``).
    :param seed: ignored (every factory in the registry takes one, for the random policy).
    :returns: the policy.
    :raises ValidationError: on a threshold outside (0, 1].
    """
    return RoundRobin(RoundRobinArgs(threshold=threshold, threshold_mode=mode))
