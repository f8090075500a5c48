"""Per-shape feasibility masks and rank keys, kept current by re-checking only the nodes that changed.

A placement cycle sees few distinct request *shapes* (the profiler turns tasks into a handful of
demand vectors), and each commit or release changes exactly one node. So for each recently used
shape the engine keeps

* ``mask``: which nodes pass the shared filter (constraints, every dimension ≤ threshold after
  placement, the right free GPUs), and
* ``keyed``: for policies that rank by a per-node key (Alg. 1-3), that key on the feasible nodes
  and ``+inf`` on the others, so choosing a node is a single ``argmin``.

The cluster state appends the index of every node it changes to a log. Before a shape is used
again, the nodes logged since its last use are re-checked one by one with the scalar filter
(:meth:`ClusterState.fits`, the reference's own ``used + demand <= limit`` comparisons) and the
policy's scalar key (``key_at``); when more nodes changed than that is worth, the entry is
rebuilt with the vectorised filter instead. Either way the entry holds exactly what a full
vectorised pass would compute now, so decisions are unchanged; only their cost is.

What a shape is: the demand vector, the whole-GPU count, the per-GPU memory and the
constraints — everything the filter and the keys read from a request. The gang size is not
part of it (it only says how many of the feasible nodes to take).
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from common.scheduling import Request
from coordinator._placement_state import ClusterState
from coordinator.policies._base import BoolArray, FloatArray, Policy

__all__ = ["ShapeCache", "ShapeEntry"]

_ENTRIES = 32          # shapes remembered (least recently used dropped first)
_LOG_MAX = 1 << 16     # changed-node log length before it is cut and every entry rebuilt
_REBUILD_BASE = 8      # replaying more changed nodes than base + N / per_node costs more than a rebuild
_REBUILD_PER_NODE = 256

ShapeKey = tuple[tuple[float, int, float, int, int], int, int, tuple[str, frozenset[tuple[str, str]]] | None]


class ShapeEntry:
    """One shape's current filter result and keys.

    :param mask: feasible nodes.
    :param keyed: the policy's key on feasible nodes, +inf elsewhere (None: the policy has no key).
    :param seen: length of the change log when this entry was last brought up to date.
    """

    __slots__ = ("keyed", "mask", "seen")

    def __init__(self, mask: BoolArray, keyed: FloatArray | None, seen: int) -> None:
        self.mask = mask
        self.keyed = keyed
        self.seen = seen


class ShapeCache:
    """The recently used shapes of one engine (one state, one policy).

    :param state: the engine's cluster state; its ``changes`` log is read and cut here.
    :param policy: the engine's policy; ``ranked_by_key`` policies get a ``keyed`` array.
    """

    def __init__(self, state: ClusterState, policy: Policy) -> None:
        self._state = state
        self._policy = policy
        self._entries: OrderedDict[ShapeKey, ShapeEntry] = OrderedDict()
        self._replay_max = _REBUILD_BASE + len(state.nodes) // _REBUILD_PER_NODE

    def __len__(self) -> int:
        """How many shapes are remembered."""
        return len(self._entries)

    def lookup(self, req: Request, values: tuple[float, int, float, int, int], whole: int, exact: bool) -> ShapeEntry:
        """The request's shape entry, current as of now (built or brought up to date here).

        :param req: the request.
        :param values: ``req.demand.as_tuple()``.
        :param whole: ``req.whole_gpus``.
        :param exact: ``is_exact(values)`` (passed on to the vectorised filter).
        :returns: the entry; its arrays belong to the cache (read them, do not modify them).
        """
        state = self._state
        log = state.changes
        if len(log) > _LOG_MAX:
            log.clear()
            self._entries.clear()
        constraints = (
            (req.gpu_model.lower(), frozenset(req.node_selector.items()))
            if req.gpu_model or req.node_selector
            else None
        )
        key = (values, whole, req.gpu_mem_per_gpu_bytes, constraints)
        entry = self._entries.get(key)
        if entry is None:
            entry = self._build(req, values, whole, exact)
            self._entries[key] = entry
            if len(self._entries) > _ENTRIES:
                self._entries.popitem(last=False)
            return entry
        self._entries.move_to_end(key)
        pending = len(log) - entry.seen
        if pending == 0:
            return entry
        if pending > 4 * self._replay_max:
            self._rebuild(entry, req, values, whole, exact)
            return entry
        # A node refused before and only committed to since is still refused: commits take room
        # away. Released nodes (logged as ``~i``) and nodes that were feasible are re-checked.
        mask = entry.mask
        changed: set[int] = set()
        for x in log[entry.seen :]:
            if x < 0:
                changed.add(~x)
            elif mask[x]:
                changed.add(x)
        if len(changed) > self._replay_max:
            self._rebuild(entry, req, values, whole, exact)
            return entry
        if changed:
            self._replay(entry, req, values, whole, changed)
        entry.seen = len(log)
        return entry

    def _rebuild(
        self, entry: ShapeEntry, req: Request, values: tuple[float, int, float, int, int], whole: int, exact: bool
    ) -> None:
        """Replace an entry's arrays with a fresh vectorised build."""
        fresh = self._build(req, values, whole, exact)
        entry.mask, entry.keyed, entry.seen = fresh.mask, fresh.keyed, fresh.seen

    def _build(self, req: Request, values: tuple[float, int, float, int, int], whole: int, exact: bool) -> ShapeEntry:
        """A fresh entry from the vectorised filter and the policy's key array."""
        state = self._state
        mask = state.feasible_mask(req, values, whole, exact)
        keyed = None
        if self._policy.ranked_by_key:
            keyed = np.where(mask, self._policy.key_array(state.view, req), np.inf)
        return ShapeEntry(mask, keyed, len(state.changes))

    def _replay(
        self,
        entry: ShapeEntry,
        req: Request,
        values: tuple[float, int, float, int, int],
        whole: int,
        changed: set[int],
    ) -> None:
        """Re-check the nodes that changed since the entry was last current."""
        state = self._state
        static = state.static_mask(req)
        per_gpu = req.gpu_mem_per_gpu_bytes
        mask, keyed = entry.mask, entry.keyed
        fits = state.fits
        if keyed is None:
            for i in changed:
                mask[i] = fits(i, values, whole, per_gpu, static)
            return
        key_at, view = self._policy.key_at, state.view
        for i in changed:
            ok = mask[i] = fits(i, values, whole, per_gpu, static)
            keyed[i] = key_at(view, req, i) if ok else np.inf
