"""Per-shape feasibility masks and rank keys, kept current by re-checking only the nodes that changed.

A placement cycle sees few distinct request *shapes* (the profiler turns tasks into a handful of
demand vectors), and each commit or release changes exactly one node. So for each recently used
shape the engine keeps

* ``mask``: which nodes pass the shared filter (constraints, every dimension ≤ its limit after
  placement, the right free GPUs), and
* ``keyed``: for policies that rank by a per-node key (Alg. 1-3), that key on the feasible nodes
  and ``+inf`` on the others, so choosing a node is a single ``argmin``.

The cluster state appends the index of every node it changes to a log. Before a shape is used
again, the nodes logged since its last use are re-checked one by one with the scalar filter
(:meth:`PlacementState.fits`, the scalar filter's own ``used + demand <= limit`` comparisons) and the
policy's scalar key (``key_at``); when more changes were logged than that is worth, the entry
is rebuilt with the vectorised filter instead. Either way the entry holds exactly what a full
vectorised pass would compute now, so decisions are unchanged; only their cost is.

What a shape is: the demand vector, the whole-GPU count, the per-GPU memory and the
constraints — everything the filter and the keys read from a request. The gang size is not
part of it (it only says how many of the feasible nodes to take).
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from common.domain import Request
from coordinator.scheduler.placement.state import PlacementState, is_exact
from coordinator.scheduler.policies.base import BoolArray, FloatArray, KeyedPolicy, Policy

__all__ = ["ShapeCache", "ShapeEntry"]

_ENTRIES = 32          # shapes remembered (least recently used dropped first)
_LOG_MAX = 1 << 16     # changed-node log length before it is cut and every entry rebuilt
_REBUILD_BASE = 8      # replaying more changed nodes than base + N / per_node costs more than a rebuild
_REBUILD_PER_NODE = 256

ShapeKey = tuple[tuple[float, int, float, int, int], int, int,
                 tuple[str, frozenset[tuple[str, str]], frozenset[str]] | None]


class ShapeEntry:
    """One shape's current filter result and keys.

    :param mask: feasible nodes.
    :param keyed: the policy's key on feasible nodes, +inf elsewhere (None: the policy has no key).
    :param seen: length of the change log when this entry was last brought up to date.
    :param exact: :func:`~coordinator.scheduler.placement.state.is_exact` of the shape's demand vector.
    """

    __slots__ = ("exact", "keyed", "mask", "seen")

    def __init__(self, mask: BoolArray, keyed: FloatArray | None, seen: int, exact: bool) -> None:
        self.mask = mask
        self.keyed = keyed
        self.seen = seen
        self.exact = exact


class ShapeCache:
    """The recently used shapes of one engine (one state, one policy).

    :param state: the engine's cluster state; its ``changes`` log is read and cut here.
    :param policy: the engine's policy; keyed policies (:class:`KeyedPolicy`) get a ``keyed`` array.
    """

    def __init__(self, state: PlacementState, policy: Policy) -> None:
        self._state = state
        self._policy = policy
        self._keyed = policy if isinstance(policy, KeyedPolicy) else None   # keeps a key per shape
        self._entries: OrderedDict[ShapeKey, ShapeEntry] = OrderedDict()
        self._replay_max = _REBUILD_BASE + len(state.nodes) // _REBUILD_PER_NODE

    def __len__(self) -> int:
        """How many shapes are remembered."""
        return len(self._entries)

    def lookup(self, req: Request, values: tuple[float, int, float, int, int], whole: int) -> ShapeEntry:
        """The request's shape entry, current as of now (built or brought up to date here).

        :param req: the request.
        :param values: ``req.demand.as_tuple()``.
        :param whole: ``req.whole_gpus``.
        :returns: the entry; its arrays belong to the cache (read them, do not modify them).
        """
        state = self._state
        log = state.changes
        if len(log) > _LOG_MAX:
            log.clear()
            self._entries.clear()
        key = (values, whole, req.gpu_mem_per_gpu_bytes, req.constraint_key)
        entry = self._entries.get(key)
        if entry is None:
            entry = self._build(req, values, whole, is_exact(values))
            self._entries[key] = entry
            if len(self._entries) > _ENTRIES:
                self._entries.popitem(last=False)
            return entry
        self._entries.move_to_end(key)
        pending = len(log) - entry.seen
        if pending == 0:
            return entry
        if pending > self._replay_max:
            fresh = self._build(req, values, whole, entry.exact)
            entry.mask, entry.keyed, entry.seen = fresh.mask, fresh.keyed, fresh.seen
            return entry
        self._replay(entry, req, values, whole, log[entry.seen :] if pending > 1 else (log[-1],))
        entry.seen = len(log)
        return entry

    def _build(self, req: Request, values: tuple[float, int, float, int, int], whole: int, exact: bool) -> ShapeEntry:
        """A fresh entry from the vectorised filter and the policy's key array."""
        state = self._state
        mask = state.feasible_mask(req, values, whole, exact)
        keyed = None
        if self._keyed is not None:
            keyed = np.where(mask, self._keyed.key_array(state.view, req), np.inf)
        return ShapeEntry(mask, keyed, len(state.changes), exact)

    def _replay(
        self,
        entry: ShapeEntry,
        req: Request,
        values: tuple[float, int, float, int, int],
        whole: int,
        changed: list[int] | tuple[int],
    ) -> None:
        """Re-check the nodes logged since the entry was last current (a node logged twice is checked twice).

        A node the entry refused that was only committed to since is still refused (commits take
        room away) and is skipped; released nodes (logged as ``~i``) and feasible ones are re-checked.
        """
        state = self._state
        static = state.static_mask(req)
        per_gpu = req.gpu_mem_per_gpu_bytes
        mask, keyed = entry.mask, entry.keyed
        fits, policy, view = state.fits, self._keyed, state.view
        for x in changed:
            if x < 0:
                x = ~x
            elif not mask[x]:
                continue
            ok = mask[x] = fits(x, values, whole, per_gpu, static)
            if keyed is not None and policy is not None:
                keyed[x] = policy.key_at(view, req, x) if ok else np.inf
