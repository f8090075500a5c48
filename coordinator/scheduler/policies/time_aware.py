"""Time-aware packing (the whitepaper's time-series bin packing; objective: nodes that empty together).

Each request carries the profiler's expected run time (``Request.expected_run_s``: learned per model
name and kind from finished tasks in production, the trace's in the simulator), so it is expected to
end at ``now + expected_run_s``. Ends are counted in whole minutes (:data:`END_BUCKET_S`): tasks
whose ends fall in the same minute end together. Every node remembers the minute in which the work
placed on it since it was last empty is expected to end (the latest of those minutes, never before
the current one). Among the nodes with enough resources (the shared threshold filter), the request
goes to:

1. a node already running work whose end minute is **closest** to the request's (ties: the fuller
   node, then snapshot order), so that tasks which end together share nodes and the node empties
   — and can be powered down — as a whole;
2. otherwise an empty node (snapshot order).

A request without an expected run time (or with one that gives no finite end) falls back to
Alg. 1's order (fullest node first). Requests are taken by descending compute demand like Alg. 1-3;
when no node fits, the request waits and the Resource Adaptor may wake a node. The paper's Alg. 1-3
are unchanged: this is a separate policy.

Counting in minutes makes the order one key per node for a given request end minute
(:meth:`TimeAware.time_keys`): ``2 × distance in minutes + (−utilization)`` on a busy node
(utilization taken in ``[0, 1]``, an over-full node counting as full, so a nearer minute always wins
and the fuller node breaks a tie), and a constant above every busy node's on an empty node. The
engine's shape cache keeps that key per shape and end minute and updates it node by node as commits
land, like Alg. 1's, so a decision reads the cache's block index instead of every feasible node, and
a gang takes the smallest keys without a sort. That pays off while few end minutes interleave (a few
models' run times). When many do, a one-node request is decided from an entry per shape whose key
does not depend on its end (the busy nodes whose end is not remembered, fullest first: all count as
ending now) and one pass over the nodes whose end is remembered, and a gang from a pass over its
shape's feasible nodes (:meth:`TimeAware.shape_variant`): the same choice.
"""

from __future__ import annotations

import itertools
import math
import time
from array import array
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from coordinator.domain import NodeId, NodeSnapshot, Request
from coordinator.scheduler.policies.base import (
    DEFAULT_THRESHOLD,
    DEFAULT_THRESHOLD_MODE,
    BoolArray,
    FloatArray,
    IntArray,
    NodeArrays,
    PolicyArgs,
    ShapeIndex,
    ThresholdPolicy,
    first_k_by_key,
    node_arrays,
    select_best,
)
from coordinator.scheduler.policies.max_utilization import MaxUtilization, MaxUtilizationArgs

__all__ = ["END_BUCKET_S", "NAME", "TimeAware", "TimeAwareArgs", "build"]

NAME = "time-aware"
END_BUCKET_S = 60.0
"""Expected ends are compared by the minute they fall in: ends in one minute count as together."""

_FAR = float(1 << 20)           # distances in minutes are capped here (about two years)
_EMPTY = 2.0 * (_FAR + 1.0)     # an empty node's key: above every busy node's (< 2 × _FAR)
_serials = itertools.count()    # one per policy object: its memory is part of its shape variants
_WINDOW = 64     # the shape variants of the last this many timed requests are counted
_FEW = 16        # at most this many distinct ones among them: the shape cache keeps their keys
# What the shape cache keeps for a request: Alg. 1's key (no expected end), the time-aware key of its
# end minute, or the key that finds the fullest node among those whose end is not remembered.
_ALG1, _TIME, _PRESENT = 0, 1, 2
_REMEMBERED = 1.0   # the present key of a busy node whose end is remembered (after every other busy node's)
_IDLE = 2.0         # and of an empty node (after every busy node's)


@dataclass(frozen=True, slots=True)
class TimeAwareArgs(PolicyArgs):
    """Arguments of :class:`TimeAware` (``threshold`` in (0, 1], checked when built)."""


class TimeAware(ThresholdPolicy):
    """Time-aware packing as a :class:`~coordinator.scheduler.policies.base.Policy`.

    Its rank key (:meth:`rank_key` is the policy itself) depends on the request's end minute, the
    current minute and the policy's memory of its nodes' end minutes, so the shape cache keeps one
    entry per shape and :meth:`shape_variant`. The key's forms, ``select`` and the memory's update
    all apply to the request last passed to :meth:`shape_variant` (the engine calls it when it looks
    the request's shape up, before choosing).

    :param args: validated arguments.
    :param now: the clock requests' expected ends are measured on (unix seconds; the simulator's
        virtual clock in a replay).
    """

    name = NAME
    sorts_requests = True
    scale_out = False
    varies_key = True

    def __init__(self, args: TimeAwareArgs, now: Callable[[], float] = time.time) -> None:
        super().__init__(args)
        self._now = now
        self._serial = next(_serials)
        self._minutes = array("d")   # per node: the minute its remembered work ends (-inf: none)
        self._now_minute = 0.0       # of the request in hand: the current minute,
        self._end_minute = 0.0       # the minute it is expected to end in (the current one without a run time),
        self._kind = _ALG1           # and which key the shape cache keeps for it (_ALG1: it has no expected end)
        self._remembered = array("q")   # the nodes given an end minute so far, in that order
        self._window: deque[object] = deque()      # the last _WINDOW timed requests' variants,
        self._counts: dict[object, int] = {}       # and how often each is among them
        self._empty: list[bool] = []   # per node chosen for it: empty when chosen
        self._empty_one = False        # the same for a one-node choice
        # A request without an expected run time is ranked by Alg. 1's key (fullest first, then
        # node order), with Alg. 1's own code.
        self._fullest = MaxUtilization(MaxUtilizationArgs(threshold=args.threshold,
                                                          threshold_mode=args.threshold_mode))

    def _memory(self, n_nodes: int) -> array[float]:
        """The nodes' end minutes (a new, empty memory when the node count differs)."""
        if len(self._minutes) != n_nodes:
            self._minutes = array("d", [-math.inf]) * n_nodes
            self._remembered = array("q")
        return self._minutes

    def shape_variant(self, req: Request) -> object:
        """Read the clock for ``req``: its end minute, and the current one.

        An entry of the shape cache pays off when requests of its shape and end minute come again
        soon: it is built with a pass over every node, then each later request reads its block
        index after re-checking the nodes committed to since. When many end minutes interleave
        (many models' run times), entries would be rebuilt, or long to bring up to date, more often
        than read. So the cache keeps a variant's time-aware key only when it was asked for before
        among the last :data:`_WINDOW` timed requests and those asked for at most :data:`_FEW`
        distinct variants. Any other timed request is decided from one entry per shape and minute
        that does not depend on its end: the *present* key, the fullest first among the busy nodes
        whose end is not remembered (which all count as ending now), then the others. Its best
        node, and one pass over the nodes whose end is remembered (those placed on this cycle),
        give the same choice as the time-aware key.

        :param req: the request about to be decided.
        :returns: None without an expected end (Alg. 1's key, which reads no memory); this policy's
            serial, the current minute and the request's end minute for a time-aware key; this
            policy's serial and the current minute for the present key.
        """
        now = self._now()
        self._now_minute = float(math.floor(now / END_BUCKET_S))
        run = req.expected_run_s
        end = now if run is None else now + run
        if run is None or not math.isfinite(end):
            self._kind = _ALG1
            self._end_minute = self._now_minute
            return None
        self._end_minute = float(math.floor(end / END_BUCKET_S))
        variant = self._serial, self._now_minute, self._end_minute
        window, counts = self._window, self._counts
        seen = counts.get(variant, 0)
        counts[variant] = seen + 1
        window.append(variant)
        if len(window) > _WINDOW:
            old = window.popleft()
            left = counts[old] - 1
            if left:
                counts[old] = left
            else:
                del counts[old]
        if seen > 0 and len(counts) <= _FEW:
            self._kind = _TIME
            return variant
        self._kind = _PRESENT
        return self._serial, self._now_minute

    def rank_key(self) -> TimeAware:
        """The policy itself: :meth:`key_array` and :meth:`key_at`."""
        return self

    def key_array(self, view: NodeArrays, req: Request) -> FloatArray:
        """Every node's key in the shape cache's entry for the request in hand: Alg. 1's, :meth:`time_keys`
        or the present key, as :meth:`shape_variant` chose."""
        if self._kind == _TIME:
            return self.time_keys(view)
        if self._kind == _PRESENT:
            minutes = np.frombuffer(self._memory(len(view.used_gpus)), dtype=np.float64)
            return np.where(view.used_gpus > 0,
                            np.where(minutes <= self._now_minute, np.maximum(view.neg_util, -1.0), _REMEMBERED),
                            _IDLE)
        return self._fullest.key_array(view, req)

    def time_keys(self, view: NodeArrays) -> FloatArray:
        """Every node's time-aware key for the request in hand (see the module docstring; smaller first)."""
        return np.where(view.used_gpus > 0, self._busy_keys(view, slice(None)), _EMPTY)

    def key_at(self, view: NodeArrays, req: Request, i: int) -> float:
        """``key_array(view, req)[i]``, with the same operations on one node."""
        kind = self._kind
        if kind == _ALG1:
            return view.neg_util.item(i)
        if not view.used_gpus.item(i) > 0:
            return _EMPTY if kind == _TIME else _IDLE
        m, now_m = self._memory(len(view.used_gpus))[i], self._now_minute
        if kind == _PRESENT:
            if m <= now_m:
                neg_util = view.neg_util.item(i)
                return neg_util if neg_util > -1.0 else -1.0
            return _REMEMBERED
        far = abs((m if m > now_m else now_m) - self._end_minute)
        neg_util = view.neg_util.item(i)
        return 2.0 * (far if far < _FAR else _FAR) + (neg_util if neg_util > -1.0 else -1.0)

    def select(self, view: NodeArrays, mask: BoolArray, req: Request) -> IntArray:
        """The ``req.nodes`` feasible nodes with the smallest keys (ties: the earlier node).

        With an expected end, only the feasible nodes' keys are computed: those of the busy ones
        (:meth:`time_keys`'s operations), :data:`_EMPTY` for the others.
        """
        if self._kind == _ALG1:
            return self._chose(view, first_k_by_key(self._fullest.key_array(view, req), mask, req.nodes))
        candidates = np.flatnonzero(mask)
        busy = view.used_gpus[candidates] > 0
        if req.nodes == 1 and len(candidates):
            if not busy.any():
                return self._chose(view, candidates[:1].astype(np.int64))
            nodes = candidates[busy]
            best = int(nodes[int(self._busy_keys(view, nodes).argmin())])   # the first of equal keys
            return self._chose(view, np.array([best], dtype=np.int64))
        keys = np.full(len(candidates), _EMPTY)
        keys[busy] = self._busy_keys(view, candidates[busy])
        order = np.argsort(keys, kind="stable")[: req.nodes]
        return self._chose(view, candidates[order].astype(np.int64))

    def _busy_keys(self, view: NodeArrays, nodes: IntArray | slice) -> FloatArray:
        """The time-aware key of the given nodes (``slice(None)``: every node) as busy nodes."""
        minutes = np.frombuffer(self._memory(len(view.used_gpus)), dtype=np.float64)[nodes]
        far = np.minimum(np.abs(np.maximum(minutes, self._now_minute) - self._end_minute), _FAR)
        return 2.0 * far + np.maximum(view.neg_util[nodes], -1.0)

    def select_indexed(self, view: NodeArrays, entry: ShapeIndex, req: Request) -> IntArray:
        """:meth:`select` from the shape cache's entry: its block index where it keeps the request's key,
        its mask (exact, whichever key it keeps) with the present key."""
        if self._kind == _PRESENT:
            return self.select(view, entry.mask, req)
        return self._chose(view, select_best(entry, req.nodes))

    def select_one(self, view: NodeArrays, entry: ShapeIndex, req: Request) -> int:
        """The best node by :meth:`select_indexed` (-1: none)."""
        i = entry.best()
        if self._kind == _PRESENT and i >= 0:
            return self._present_one(view, entry, i)
        self._empty_one = i >= 0 and not view.used_gpus.item(i) > 0
        return i

    def _present_one(self, view: NodeArrays, entry: ShapeIndex, first: int) -> int:
        """The time-aware choice of one node from the present key's entry, whose best node is ``first``.

        That node is empty when no busy node is feasible (the choice); else it is the fullest
        feasible busy node whose end is not remembered, if any: every such node is at the same
        distance from the request's end minute, so it is the best of them. The nodes whose end is
        remembered are compared with it by their time-aware keys, ties to the earlier node.
        """
        assert entry.keyed is not None
        key = entry.keyed.item(first)
        if key == _IDLE:
            self._empty_one = True
            return first
        best_key, best = math.inf, -1
        if key < _REMEMBERED:
            far = abs(self._now_minute - self._end_minute)
            best_key, best = 2.0 * (far if far < _FAR else _FAR) + key, first
        remembered = np.frombuffer(self._remembered, dtype=np.int64)
        feasible = remembered[entry.mask[remembered] & (view.used_gpus[remembered] > 0)]
        if len(feasible):
            keys = self._busy_keys(view, feasible)
            low = keys.min()
            i = int(feasible[keys == low].min())
            if low < best_key or (low == best_key and i < best):
                best_key, best = float(low), i
        self._empty_one = False
        return best

    def _chose(self, view: NodeArrays, chosen: IntArray) -> IntArray:
        """Note which chosen nodes are empty (their memory starts again when committed)."""
        used = view.used_gpus
        self._empty = empty = [not used.item(i) > 0 for i in chosen.tolist()]
        self._empty_one = bool(empty) and empty[0]
        return chosen

    def committed(self, indices: IntArray, n_nodes: int) -> None:
        """The chosen nodes now hold work expected to end in the request's end minute (the latest
        minute wins; a node that was empty when chosen remembers only this one)."""
        memory, end = self._memory(n_nodes), self._end_minute
        for i, empty in zip(indices.tolist(), self._empty, strict=True):
            last = memory[i]
            if last == -math.inf:
                self._remembered.append(i)
            memory[i] = end if empty or end > last else last

    def committed_one(self, i: int, n_nodes: int) -> None:
        """:meth:`committed` for the one node ``i``."""
        memory, end = self._memory(n_nodes), self._end_minute
        last = memory[i]
        if last == -math.inf:
            self._remembered.append(i)
        memory[i] = end if self._empty_one or end > last else last

    def rank(self, req: Request, nodes: Sequence[NodeSnapshot]) -> list[NodeId]:
        """Node ids in the order tried, from snapshots (the readable form of :meth:`select`)."""
        self.shape_variant(req)
        view = node_arrays(nodes)
        keys = self._fullest.key_array(view, req) if self._kind == _ALG1 else self.time_keys(view)
        order = np.argsort(keys, kind="stable")
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
