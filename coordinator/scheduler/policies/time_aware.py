"""Time-aware packing (the whitepaper's time-series bin packing; objective: nodes that empty together).

Each request carries the profiler's expected run time (``Request.expected_run_s``: learned per model
name and kind from finished tasks in production, the trace's in the simulator), so it is expected to
end at ``now + expected_run_s``. Every node remembers when the work placed on it since it was last
empty is expected to end (the latest of those ends, never before now). Among the nodes with enough
resources (the shared threshold filter), the request goes to:

1. a node already running work, whose expected end is **closest** to the request's (ties: the
   fuller node, then snapshot order), so that tasks which end together share nodes and the node
   empties — and can be powered down — as a whole;
2. otherwise an empty node (fullest first is moot: snapshot order).

A request without an expected run time falls back to Alg. 1's order (fullest node first). Requests
are taken by descending compute demand like Alg. 1-3; when no node fits, the request waits and the
Resource Adaptor may wake a node. The paper's Alg. 1-3 are unchanged: this is a separate policy.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from common.domain import NodeId, NodeSnapshot, Request
from coordinator.scheduler.policies.base import (
    DEFAULT_THRESHOLD,
    DEFAULT_THRESHOLD_MODE,
    BoolArray,
    FloatArray,
    IntArray,
    KeyedPolicy,
    NodeArrays,
    PolicyArgs,
    ShapeIndex,
    ThresholdPolicy,
    select_best,
)
from coordinator.scheduler.policies.max_utilization import MaxUtilization, MaxUtilizationArgs

__all__ = ["NAME", "TimeAware", "TimeAwareArgs", "build"]

NAME = "time-aware"


@dataclass(frozen=True, slots=True)
class TimeAwareArgs(PolicyArgs):
    """Arguments of :class:`TimeAware` (``threshold`` in (0, 1], checked when built)."""


class TimeAware(ThresholdPolicy):
    """Time-aware packing as a :class:`~coordinator.scheduler.policies.base.Policy`.

    :param args: validated arguments.
    :param now: the clock requests' expected ends are measured on (unix seconds; the simulator's
        virtual clock in a replay).
    """

    name = NAME
    sorts_requests = True
    scale_out = False

    def __init__(self, args: TimeAwareArgs, now: Callable[[], float] = time.time) -> None:
        super().__init__(args)
        self._now = now
        self._ends: FloatArray = np.zeros(0)
        self._pending_end = 0.0
        self._chosen_empty: BoolArray = np.zeros(0, dtype=np.bool_)
        # A request without an expected run time is ranked by Alg. 1's key (fullest first, then
        # node order); the shape cache keeps that key, so such requests are chosen like Alg. 1's.
        self._fullest = MaxUtilization(MaxUtilizationArgs(threshold=args.threshold,
                                                          threshold_mode=args.threshold_mode))

    def _node_ends(self, used_gpus: FloatArray, now: float) -> FloatArray:
        """Expected end per node (-inf on empty nodes, whose memory is forgotten)."""
        if len(self._ends) != len(used_gpus):
            self._ends = np.full(len(used_gpus), -np.inf)
        self._ends[used_gpus <= 0] = -np.inf
        return np.where(used_gpus > 0, np.maximum(self._ends, now), -np.inf)

    def _order(self, neg_util: FloatArray, used_gpus: FloatArray, candidates: IntArray, req: Request) -> IntArray:
        """Candidates in the order tried (see the module docstring)."""
        now = self._now()
        ends = self._node_ends(used_gpus, now)
        if req.expected_run_s is None:
            self._pending_end = now
            return candidates[np.lexsort((candidates, neg_util[candidates]))]
        end = now + req.expected_run_s
        self._pending_end = end
        busy = used_gpus[candidates] > 0
        gap = np.where(busy, np.abs(ends[candidates] - end), np.inf)
        return candidates[np.lexsort((candidates, neg_util[candidates], gap, ~busy))]

    def select(self, view: NodeArrays, mask: BoolArray, req: Request) -> IntArray:
        """The ``req.nodes`` feasible nodes first in the time-aware order."""
        candidates = np.flatnonzero(mask).astype(np.int64)
        chosen = self._order(view.neg_util, view.used_gpus, candidates, req)[: req.nodes]
        self._chosen_empty = view.used_gpus[chosen] <= 0
        return chosen

    def rank_key(self) -> KeyedPolicy:
        """Alg. 1's key, the order of requests without an expected run time."""
        return self._fullest

    def select_indexed(self, view: NodeArrays, entry: ShapeIndex, req: Request) -> IntArray:
        """:meth:`select`, reading the shape cache where that gives the same nodes.

        Without an expected run time the order is Alg. 1's, which the entry keeps (its block
        index finds the best node without a sort). With one, a single node is found with a few
        passes over the feasible nodes (closest end among busy ones, then fullest, then node
        order: the first of :meth:`_order`'s order) instead of sorting them all.
        """
        if req.expected_run_s is None:
            self._pending_end = self._now()
            chosen = select_best(entry, req.nodes)
            # Nodes empty when chosen start a new memory of ends (what _node_ends's forgetting gives).
            used = view.used_gpus
            self._chosen_empty = np.array([used.item(i) <= 0 for i in chosen.tolist()], dtype=np.bool_)
            return chosen
        if req.nodes != 1:
            return self.select(view, entry.mask, req)
        now = self._now()
        end = now + req.expected_run_s
        self._pending_end = end
        if len(self._ends) != len(entry.mask):
            self._ends = np.full(len(entry.mask), -np.inf)
        candidates = np.flatnonzero(entry.mask)
        if len(candidates) == 0:
            return candidates.astype(np.int64)
        busy = candidates[view.used_gpus[candidates] > 0]
        if len(busy):
            # Ends of the feasible busy nodes only: an empty node's end is forgotten when it is chosen
            # (committed), which gives what _node_ends's forgetting at every choice gives.
            gap = np.abs(np.maximum(self._ends[busy], now) - end)
            candidates = busy[gap == gap.min()]
        best = candidates[int(view.neg_util[candidates].argmin())]
        self._chosen_empty = np.array([view.used_gpus[best] <= 0])
        return np.array([best], dtype=np.int64)

    def committed(self, indices: IntArray, n_nodes: int) -> None:
        """The chosen nodes now hold work expected to end at the request's end (the latest end wins;
        a node that was empty when chosen remembers only this end)."""
        if len(self._ends) != n_nodes:
            self._ends = np.full(n_nodes, -np.inf)
        if len(indices) == 1:   # the same as below, on one node without building arrays
            i, ends, end = int(indices[0]), self._ends, self._pending_end
            last = -math.inf if self._chosen_empty[0] else ends.item(i)
            ends[i] = last if last > end or last != last else end   # np.maximum (NaN wins)
            return
        before = np.where(self._chosen_empty, -np.inf, self._ends[indices])
        self._ends[indices] = np.maximum(before, self._pending_end)

    def rank(self, req: Request, nodes: Sequence[NodeSnapshot]) -> list[NodeId]:
        """Node ids in the order tried, from snapshots (the readable form of :meth:`select`)."""
        neg_util = np.array([-n.compute_util for n in nodes], dtype=np.float64)
        used = np.array([n.used.gpus for n in nodes], dtype=np.float64)
        order = self._order(neg_util, used, np.arange(len(nodes), dtype=np.int64), req)
        return [nodes[i].node_id for i in order.tolist()]


def build(threshold: float = DEFAULT_THRESHOLD, *, seed: int | None = None,
          mode: str = DEFAULT_THRESHOLD_MODE,
          now: Callable[[], float] = time.time) -> TimeAware:
    """Build the policy.

    :param threshold: cap on every dimension's utilization after placement, in (0, 1].
    :param mode: which dimensions the threshold caps (``whole-gpus`` or ``paper``).
    :param seed: ignored (every factory in the registry takes one, for the random policy).
    :param now: the clock expected ends are measured on.
    :returns: the policy.
    :raises ValidationError: on a threshold outside (0, 1].
    """
    return TimeAware(TimeAwareArgs(threshold=threshold, threshold_mode=mode), now)
