"""Per-shape feasibility masks and rank keys, kept current by re-checking only the nodes that changed.

A placement cycle sees few distinct request *shapes* (the profiler turns tasks into a handful of
demand vectors), and each commit or release changes exactly one node. So for each recently used
shape the engine keeps

* ``mask``: which nodes pass the shared filter (constraints, every dimension ≤ its limit after
  placement, the right free GPUs), and
* ``keyed``: for policies that rank by a per-node key (Alg. 1-3), that key on the feasible nodes
  and ``+inf`` on the others, so choosing a node is a single ``argmin``.

Each entry also keeps a **block index** over its arrays: the nodes are cut into blocks of
``BLOCK`` consecutive indices, and per block the entry keeps the smallest key (keyed policies) and
the number of feasible nodes. Choosing the best node is then an ``argmin`` over the block minima
and one over a single block, and the k-th feasible node (one of the random baseline's draws) a walk
over the counts of groups of ``GROUP`` blocks, then over one group's block counts, and one block's
``flatnonzero``: a decision reads about ``N / BLOCK + BLOCK`` entries instead of ``N``. The first
of equal minima is the first in node order either way, so the choice is exactly
``keyed.argmin()``'s.

For policies that take the first feasible node from a point on (first-fit, round-robin:
``confirms_lazily``), a node that was only committed to since the entry was current (commits
only take room away) is not re-checked at once: it stays in the mask as a *suspect*, and is
re-checked when a choice lands on it (:meth:`ShapeEntry.confirm`), or with every other suspect
before anything else reads the mask (:meth:`ShapeEntry.settle`). A choice therefore still lands on
the first node that passes the filter now.

The cluster state appends the index of every node it changes to a log. Before a shape is used
again, the nodes logged since its last use are re-checked one by one with the scalar filter
(:meth:`PlacementState.fits`, the scalar filter's own ``used + demand <= limit`` comparisons) and the
policy's scalar key (``key_at``); when more changes were logged than that is worth, the entry
is rebuilt with the vectorised filter instead. Either way the entry holds exactly what a full
vectorised pass would compute now, so decisions are unchanged; only their cost is.

What a shape is: the demand vector, the whole-GPU count, the per-GPU memory and the
constraints — everything the filter and the keys read from a request. The gang size is not
part of it (it only says how many of the feasible nodes to take). A policy whose key reads more
than the shape (``varies_key``: time-aware's reads the request's end minute and the policy's
memory of its nodes) adds its :meth:`~coordinator.scheduler.policies.base.Policy.shape_variant`, so
one shape has an entry per variant.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Callable

import numpy as np

from coordinator.domain import Request
from coordinator.scheduler.placement.state import PlacementState, is_exact
from coordinator.scheduler.policies.base import BoolArray, FloatArray, IntArray, Policy

__all__ = ["BLOCK", "ShapeCache", "ShapeEntry"]

_ENTRIES = 32          # shapes remembered (least recently used dropped first)
_LOG_MAX = 1 << 16     # changed-node log length before it is cut and every entry rebuilt
_REBUILD_BASE = 8      # replaying more changed nodes than base + N / per_node costs more than a rebuild
_REBUILD_PER_NODE = 256
BLOCK = 128            # nodes per block of an entry's block index
GROUP = 16             # blocks per group of the feasible counts (the random draw walks groups, then blocks)
_INF = array("d", [float("inf")])

ConstraintKey = tuple[str, frozenset[tuple[str, str]], frozenset[str], frozenset[str]] | None
ShapeKey = tuple[tuple[float, int, float, int, int], int, int, ConstraintKey, object]


def _blocks(n: int) -> int:
    """How many blocks ``n`` nodes make (at least one)."""
    return max(1, -(-n // BLOCK))


class ShapeEntry:
    """One shape's current filter result and keys, with their block index.

    The arrays live in Python buffers (a ``bytearray`` for the mask, ``array('d')`` for the keys
    and block minima) that :attr:`mask`, :attr:`keyed` and the block views are numpy views of:
    vectorised reads go through numpy, and the node-by-node updates of a replay write the buffers
    directly, which costs a fraction of a numpy scalar access. The feasible counts are lists, per
    block and per group of ``GROUP`` blocks, so the random draw walks groups and then blocks.

    :param mask: feasible nodes.
    :param keyed: the policy's key on feasible nodes, +inf elsewhere (None: the policy has no key).
    :param seen: length of the change log when this entry was last brought up to date.
    :param exact: :func:`~coordinator.scheduler.placement.state.is_exact` of the shape's demand vector.
    :param check: the filter for one node now (:meth:`PlacementState.checker` of the shape); None
        only for an entry that is never replayed or confirmed.
    """

    __slots__ = ("_block_key", "_block_mask", "_block_min", "_block_rows", "_check", "_kbuf", "_lbuf", "_mbuf", "_ties",
                 "block_count", "exact", "feasible", "group_count", "keyed", "mask", "seen", "suspects")

    def __init__(self, mask: BoolArray, keyed: FloatArray | None, seen: int, exact: bool,
                 check: Callable[[int], bool] | None = None) -> None:
        self.seen = seen
        self.exact = exact
        self.suspects: set[int] = set()   # feasible in the mask, committed to since, not yet re-checked
        self._check = check
        self.reindex(mask, keyed)

    def confirm(self, i: int) -> bool:
        """Whether node ``i`` (feasible in the mask) passes the filter now: a suspect is re-checked, and
        dropped from the mask when it no longer passes.

        :param i: a node the mask holds as feasible.
        :returns: True when it is feasible now.
        """
        if i not in self.suspects:
            return True
        self.suspects.discard(i)
        assert self._check is not None
        if self._check(i):
            return True
        self._mbuf[i] = False
        self.count(i // BLOCK, -1)
        return False

    def settle(self) -> None:
        """Re-check every suspect, so that the mask (and the counts) are exact."""
        mbuf = self._mbuf
        for i in list(self.suspects):
            if mbuf[i]:
                self.confirm(i)
        self.suspects.clear()

    def count(self, b: int, d: int) -> None:
        """Add ``d`` to block ``b``'s feasible count (the mask changed there)."""
        self.block_count[b] += d
        self.group_count[b // GROUP] += d
        self.feasible += d

    def reindex(self, mask: BoolArray, keyed: FloatArray | None) -> None:
        """Take new arrays (a rebuild) and compute their block index from scratch.

        The arrays are copied into buffers padded to whole blocks (refused, key +inf), and
        :attr:`mask` and :attr:`keyed` become views of their first ``N`` entries.
        """
        self.suspects = set()
        n = len(mask)
        blocks = _blocks(n)
        self._mbuf = bytearray(blocks * BLOCK)
        padded_mask = np.frombuffer(self._mbuf, dtype=np.bool_)
        padded_mask[:n] = mask
        self.mask = padded_mask[:n]
        self._block_mask = padded_mask.reshape(blocks, BLOCK)
        self._block_rows = list(self._block_mask)   # one view per block, made once
        self.block_count = self._block_mask.sum(axis=1).tolist()
        self.group_count = [sum(self.block_count[g : g + GROUP]) for g in range(0, blocks, GROUP)]
        self.feasible = sum(self.group_count)
        if keyed is None:
            self.keyed = None
            self._block_key = self._block_min = None
            return
        self._kbuf = array("d", _INF) * (blocks * BLOCK)
        padded_key = np.frombuffer(self._kbuf, dtype=np.float64)
        padded_key[:n] = keyed
        self.keyed = padded_key[:n]
        self._block_key = padded_key.reshape(blocks, BLOCK)
        low = self._block_key.min(axis=1)
        self._lbuf = array("d", low.tolist())
        self._block_min = np.frombuffer(self._lbuf, dtype=np.float64)
        self._ties = (self._block_key == low[:, None]).sum(axis=1).tolist()   # nodes at their block's minimum

    def refresh_minima(self, blocks: set[int]) -> None:
        """Recompute the smallest key of the given blocks and how many of their nodes hold it (their
        nodes' keys changed; the feasible counts are kept by whoever changes the mask)."""
        if self._block_key is not None:
            block_key, low, ties = self._block_key, self._lbuf, self._ties
            for b in blocks:
                row = block_key[b]
                m = row.min()
                low[b] = m
                ties[b] = int(np.count_nonzero(row == m))

    def set_key(self, i: int, key: float, stale: set[int]) -> None:
        """Set node ``i``'s key, keeping its block's minimum (and how many nodes hold it) exact: at once
        where that is known, else by adding the block to ``stale`` (for :meth:`refresh_minima`): when
        the last node at the minimum leaves it, or with a NaN."""
        kbuf, low, ties = self._kbuf, self._lbuf, self._ties
        old = kbuf[i]
        kbuf[i] = key
        b = i // BLOCK
        m = low[b]
        if key < m:
            low[b] = key
            ties[b] = 1
        elif key == m:
            if old != m:
                ties[b] += 1
        elif key > m and old > m:
            pass                      # neither key is the minimum
        elif key > m and old == m and ties[b] > 1:
            ties[b] -= 1              # another node still holds the minimum
        else:
            stale.add(b)

    def best(self) -> int:
        """The feasible node with the smallest key, the first of equal ones (-1: none is feasible).

        Exactly ``keyed.argmin()`` where that node is feasible: the first block holding the
        smallest key, then the first node holding it in that block.
        """
        assert self._block_min is not None and self._block_key is not None
        b = int(self._block_min.argmin())
        i = b * BLOCK + int(self._block_key[b].argmin())
        return i if i < len(self.mask) and self._mbuf[i] else -1

    def first_k(self, count: int) -> IntArray:
        """The ``count`` feasible nodes with the smallest keys, best first (ties: earlier node); fewer when
        fewer are feasible. The same order as a stable sort of the feasible nodes by key.

        Takes the best, sets it aside (refused, key +inf), repeats, and puts the taken ones back.
        """
        assert self._block_min is not None and self._block_key is not None
        chosen: list[int] = []
        saved: list[float] = []
        kbuf, mbuf, low = self._kbuf, self._mbuf, self._lbuf
        for _ in range(count):
            i = self.best()
            if i < 0:
                break
            chosen.append(i)
            saved.append(kbuf[i])
            kbuf[i], mbuf[i] = _INF[0], False
            low[i // BLOCK] = self._block_key[i // BLOCK].min()
        for i, k in zip(chosen, saved, strict=True):
            kbuf[i], mbuf[i] = k, True
        self.refresh_minima({i // BLOCK for i in chosen})
        return np.array(chosen, dtype=np.int64)

    def first_from(self, start: int, stop: int = -1) -> int:
        """The first node the mask holds feasible in ``[start, stop)`` (``stop`` -1: to the end), -1 when none:
        a byte search of the mask's buffer (a suspect counts as feasible, as in :attr:`mask`).

        :param start: the first node to look at.
        :param stop: one past the last (-1: every node from ``start`` on).
        :returns: a node index, or -1.
        """
        if stop < 0:
            return self._mbuf.find(1, start)
        return self._mbuf.find(1, start, stop)

    @property
    def flags(self) -> bytearray:
        """The mask as bytes (1: feasible), padded to whole blocks with 0: read them, do not write them."""
        return self._mbuf

    def nth(self, rem: int) -> int:
        """The ``rem``-th feasible node in node order (``0 <= rem < feasible``): ``flatnonzero(mask)[rem]``
        from the block counts, without listing every feasible node.

        :param rem: a position among the feasible nodes.
        :returns: a node index.
        """
        # The group of blocks, then the block, holding the rem-th feasible node (those before hold
        # at most rem together), then the node within the block.
        groups, counts = self.group_count, self.block_count
        g = 0
        while rem >= groups[g]:
            rem -= groups[g]
            g += 1
        b = g * GROUP
        while rem >= counts[b]:
            rem -= counts[b]
            b += 1
        return b * BLOCK + int(self._block_rows[b].nonzero()[0][rem])

    def set_aside(self, i: int) -> None:
        """Read feasible node ``i`` as refused (mask and counts; a key is kept) until :meth:`put_back`."""
        self._mbuf[i] = False
        self.count(i // BLOCK, -1)

    def put_back(self, nodes: list[int]) -> None:
        """Undo :meth:`set_aside` for each of ``nodes``."""
        mbuf = self._mbuf
        for i in nodes:
            mbuf[i] = True
            self.count(i // BLOCK, 1)


class ShapeCache:
    """The recently used shapes of one engine (one state, one policy).

    :param state: the engine's cluster state; its ``changes`` log is read and cut here.
    :param policy: the engine's policy; keyed policies (:class:`KeyedPolicy`) get a ``keyed`` array.
    """

    def __init__(self, state: PlacementState, policy: Policy) -> None:
        self._state = state
        self._entries: OrderedDict[ShapeKey, ShapeEntry] = OrderedDict()
        self._replay_max = _REBUILD_BASE + len(state.nodes) // _REBUILD_PER_NODE
        self.bind(policy)

    def bind(self, policy: Policy) -> None:
        """Serve ``policy`` from now on: a policy of the same name, made for a new cycle, whose key is
        computed the same way (its memory, where the key reads one, is part of its shape variants).

        :param policy: the engine's policy.
        """
        self._keyed = policy.rank_key()   # keeps a key per shape (None: the policy ranks by none)
        self._lazy = policy.confirms_lazily and self._keyed is None
        self._variant = policy.shape_variant if policy.varies_key else None

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
        constraints = req.constraint_key
        variant = self._variant
        key = (values, whole, req.gpu_mem_per_gpu_bytes, constraints, None if variant is None else variant(req))
        entry = self._entries.get(key)
        if entry is None:
            entry = self._build(req, values, whole, is_exact(values), constraints)
            self._entries[key] = entry
            if len(self._entries) > _ENTRIES:
                self._entries.popitem(last=False)
            return entry
        self._entries.move_to_end(key)
        pending = len(log) - entry.seen
        if pending == 0:
            return entry
        if pending > self._replay_max or pending < 0:   # (< 0: the log was cut since)
            mask, keyed = self._arrays(req, values, whole, entry.exact)
            entry.reindex(mask, keyed)
            entry.seen = len(log)
            return entry
        self._replay(entry, req, log[entry.seen :] if pending > 1 else (log[-1],))
        entry.seen = len(log)
        return entry

    def _arrays(
        self, req: Request, values: tuple[float, int, float, int, int], whole: int, exact: bool
    ) -> tuple[BoolArray, FloatArray | None]:
        """The vectorised filter's mask and the policy's key array (+inf on refused nodes)."""
        state = self._state
        mask = state.feasible_mask(req, values, whole, exact)
        keyed = None
        if self._keyed is not None:
            keyed = np.where(mask, self._keyed.key_array(state.view, req), np.inf)
        return mask, keyed

    def _build(self, req: Request, values: tuple[float, int, float, int, int], whole: int, exact: bool,
               constraints: ConstraintKey) -> ShapeEntry:
        """A fresh entry from the vectorised filter and the policy's key array."""
        mask, keyed = self._arrays(req, values, whole, exact)
        check = self._state.checker(values, whole, req.gpu_mem_per_gpu_bytes, constraints)
        return ShapeEntry(mask, keyed, len(self._state.changes), exact, check)

    def _replay(self, entry: ShapeEntry, req: Request, changed: list[int] | tuple[int]) -> None:
        """Re-check the nodes logged since the entry was last current (a node logged twice is checked twice).

        A node the entry refused that was only committed to since is still refused (commits take
        room away) and is skipped; released nodes (logged as ``~i``) and feasible ones are re-checked.
        """
        mbuf, check = entry._mbuf, entry._check
        assert check is not None
        policy = self._keyed
        if entry.keyed is None or policy is None:
            counts, groups, block, group, flips = entry.block_count, entry.group_count, BLOCK, GROUP, 0
            if not self._lazy:
                # Every logged node the mask holds is re-checked now.
                for x in changed:
                    if x >= 0:
                        if not mbuf[x]:
                            continue
                        was = 1
                    else:
                        x = ~x
                        was = mbuf[x]
                    ok = check(x)
                    if ok != was:   # ShapeEntry.count, inline
                        mbuf[x] = ok
                        d = 1 if ok else -1
                        b = x // block
                        counts[b] += d
                        groups[b // group] += d
                        flips += d
                entry.feasible += flips
                return
            suspects = entry.suspects   # (lazily confirmed: a node only committed to becomes a suspect)
            for x in changed:
                if x < 0:
                    x = ~x
                    was = mbuf[x]
                    suspects.discard(x)   # re-checked now
                elif mbuf[x]:
                    suspects.add(x)       # re-checked when a choice lands on it (ShapeEntry.confirm)
                    continue
                else:
                    continue
                ok = check(x)
                if ok != was:   # ShapeEntry.count, inline
                    mbuf[x] = ok
                    d = 1 if ok else -1
                    b = x // block
                    counts[b] += d
                    groups[b // group] += d
                    flips += d
            entry.feasible += flips
            return
        stale: set[int] = set()
        key_at, view, set_key, inf = policy.key_at, self._state.view, entry.set_key, _INF[0]
        for x in changed:
            if x < 0:
                x = ~x
                was = mbuf[x]
            elif not mbuf[x]:
                continue
            else:
                was = 1
            ok = check(x)
            if ok != was:
                mbuf[x] = ok
                entry.count(x // BLOCK, 1 if ok else -1)
            set_key(x, key_at(view, req, x) if ok else inf, stale)
        if stale:
            entry.refresh_minima(stale)
