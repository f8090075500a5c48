"""The placement engine's indexed, vectorised copy of a :class:`ClusterSnapshot`.

Per-dimension capacity, reservation and limit (``factor × capacity``, the factors of
:func:`~coordinator.scheduler.policies.base.limit_factors`) live in ``(5, N)`` float64 arrays, so
the threshold filter for one request over every node is a few numpy calls deciding exactly what
the scalar filter's ``used + demand <= factor * capacity`` decides. An unschedulable node gets a
limit of ``-inf``, so no request passes it.

The limit arrays hold the limits of a request for whole GPUs (or none). Where a shared request's
factors are lower (the GPU dimensions in ``whole-gpus`` mode), those dimensions' tighter limits
are kept apart (:attr:`PlacementState.shared_dims`) and checked on top for shared requests only;
in ``paper`` mode every request has the same limits and there is nothing more to check.

The filter compares the demand with a precomputed **headroom** (``limit - used``, with the limit
floored for the whole-byte dimensions) instead of adding and comparing. That is exact while every
reservation and demand is *exact* (:func:`is_exact`: bytes whole, GPUs and cores multiples of
2**-20, which shares of 1/16 and half cores are): the additions then never round. Any other
value switches the state to the general ``used + demand <= limit`` path for good. Dimensions in
which the demand is at most the smallest headroom of any node are not compared at all.

Per-GPU state lives in Python lists per node (what the allocator reads when committing);
``whole_desc[k - 1]`` holds, per node, the k-th largest free memory among its fully free GPUs, so
"k free GPUs with ≥ X bytes" is one comparison over a contiguous row, and partly shared GPUs are
indexed apart (:class:`~coordinator.scheduler.placement.partial_gpus.PartialGpus`).

Committing or releasing updates one node's Python mirrors (``rows``: its reservations and limits in
one array, ``free_desc``, the GPU lists) and logs the node in :attr:`PlacementState.changes`; the
numpy columns follow lazily, just before the next vectorised read. So do the node's utilization,
GPUs reserved and power drawn (the :attr:`PlacementState.view` policies rank by) when the policy
placing does not read them (random, first-fit, round-robin). :meth:`PlacementState.fits` is the
filter for one node, which the shape cache uses to re-check the logged nodes.

Two upper bounds make hopeless requests cheap: the largest headroom of each dimension over all
nodes, and the largest k-th free GPU memory. Commits only shrink headroom, so a bound computed
earlier stays an upper bound; it is refreshed whenever a request goes the full way and is refused.

Byte counts are held as float64: exact below 2**53 bytes (8 PiB), far above any node.
"""

from __future__ import annotations

import itertools
import math
from array import array
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import cast

import numpy as np

from common.errors import PlacementError
from common.topology import NodeTopology
from coordinator.allocator.gpus import choose_gpu_indices
from coordinator.allocator.reservations import CRUMB, give_back_gpu, take_gpu
from coordinator.domain import (
    DIMENSIONS,
    ClusterSnapshot,
    GpuSlot,
    NodeAssignment,
    NodeSnapshot,
    Request,
    Resources,
    new_assignment,
)
from coordinator.scheduler.placement.partial_gpus import PartialGpus
from coordinator.scheduler.policies.base import (
    DEFAULT_THRESHOLD_MODE,
    BoolArray,
    FloatArray,
    IntArray,
    NodeArrays,
    limit_factors,
)

__all__ = ["PlacementState", "is_exact"]

_DIMS = 5
_STATIC_CACHE = 256   # constraint masks kept (a cycle with more distinct constraint sets recomputes them)
# Headroom ``limit - used`` is computed with rounding; a bound this much above it (relative to the
# largest magnitude in the dimension) is safely above every demand the exact test would accept.
_BOUND_SLACK = 2.0**-40
_FLOAT_DIMS = (0, 2)  # gpus, cpu_cores: floats; the other three are whole bytes
_BYTE_DIMS = (1, 3, 4)
_DYADIC = 2.0**20  # float values that are multiples of 2**-20 (and below 2**32) add without rounding
_DYADIC_MAX = 2.0**32
_BYTES_MAX = 2.0**53
_INDICES: dict[tuple[int, ...], tuple[int, ...]] = {}   # GPU index tuples handed out, each kept once
_INDICES_MAX = 4096
_ALL: dict[int, tuple[int, ...]] = {}   # (0, ..., n - 1) per GPU count n
_CHOICES_MAX = 4096   # GPU choices remembered by commit
_POWER = 4   # values per node in PlacementState.power_rows
_SHARED = 10   # where its shared requests' lower limits start there
_SYNC_BULK = 64   # dirty columns from which _sync writes them with one fancy-indexed assignment per array


def _free_whole(mem_free: list[float], share_free: list[float]) -> list[float]:
    """Free memory of a node's fully free GPUs, largest first (a ``free_desc`` entry)."""
    free = [m for m, s in zip(mem_free, share_free, strict=True) if s >= 1.0]
    free.sort(reverse=True)
    return free


_NONE_DEGRADED: frozenset[int] = frozenset()


def _degraded(gpus: tuple[GpuSlot, ...]) -> frozenset[int]:
    """Positions of a node's DEGRADED GPUs (the allocator takes them last); one shared empty set for none."""
    if not any([g.degraded for g in gpus]):
        return _NONE_DEGRADED
    return frozenset(k for k, g in enumerate(gpus) if g.degraded)


def _shared(indices: tuple[int, ...]) -> tuple[int, ...]:
    """The one tuple kept for these GPU indices: placements share one tuple per GPU set, so a batch
    leaves fewer new objects for the collector."""
    shared = _INDICES.get(indices)
    if shared is None:
        if len(_INDICES) >= _INDICES_MAX:
            _INDICES.clear()
        shared = _INDICES[indices] = indices
    return shared


def _unmark(marks: bytearray, listed: list[int]) -> None:
    """Clear the byte of every listed node (one numpy assignment for many)."""
    if len(listed) < _SYNC_BULK:
        for i in listed:
            marks[i] = 0
    else:
        np.frombuffer(marks, dtype=np.uint8)[listed] = 0


def is_exact(values: tuple[float, int, float, int, int]) -> bool:
    """Whether a vector's float dimensions are dyadic (multiples of 2**-20) and its bytes whole.

    For such values ``used + demand`` never rounds, and ``demand <= limit - used`` (the
    precomputed headroom) decides exactly what ``used + demand <= limit`` decides; see
    :class:`PlacementState`.

    :param values: a vector in :data:`coordinator.domain.DIMENSIONS` order.
    :returns: True when the headroom shortcut is exact for it.
    """
    gpus, gpu_mem, cpu, mem, disk = values
    for b in (gpu_mem, mem, disk):
        if not (type(b) is int or float(b).is_integer()) or abs(b) >= _BYTES_MAX:
            return False
    return (
        abs(gpus) < _DYADIC_MAX
        and abs(cpu) < _DYADIC_MAX
        and (gpus * _DYADIC).is_integer()
        and (cpu * _DYADIC).is_integer()
    )


def _rows(columns: FloatArray) -> list[array[float]]:
    """A ``(K, N)`` array's columns as one ``array('d')`` each."""
    flat = array("d")
    flat.frombytes(np.ascontiguousarray(columns.T).tobytes())
    width = columns.shape[0]
    return [flat[k : k + width] for k in range(0, len(flat), width)]


def _columns(nodes: tuple[NodeSnapshot, ...], attr: str) -> FloatArray:
    """A ``(5, N)`` float64 array of ``node.<attr>`` vectors."""
    rows = [getattr(node, attr).as_tuple() for node in nodes]
    return np.array(rows, dtype=np.float64).reshape(len(nodes), _DIMS).T.copy()


class PlacementState:
    """Arrays for every node of a snapshot, updated in place as placements commit.

    :param snapshot: the cluster at the start of the cycle (its node order is kept).
    :param threshold: cap on the capped dimensions' utilization after placement.
    :param mode: the threshold mode (which dimensions it caps; see ``limit_factors``).
    """

    def __init__(self, snapshot: ClusterSnapshot, threshold: float, mode: str = DEFAULT_THRESHOLD_MODE) -> None:
        nodes = snapshot.nodes
        self.nodes: list[NodeSnapshot] = list(nodes)
        self.taken_at_s = snapshot.taken_at_s
        self.index = {node.node_id: i for i, node in enumerate(nodes)}
        self.node_ids = [node.node_id for node in nodes]   # (a node keeps its index's id: see apply)
        self._init_dimensions(nodes, threshold, mode)
        self._init_power(nodes)
        self._init_gpus(nodes)
        self._bounds_stale = True
        self.derive_on_commit = True   # see set_derive_on_commit
        self._underived = False        # a commit left a node's view values to _sync
        self._ok_buf = np.empty((_DIMS, len(nodes)), dtype=np.bool_)
        self._sum_buf = np.empty((_DIMS, len(nodes)))
        self._static: dict[tuple[str, frozenset[tuple[str, str]], frozenset[str], frozenset[str]], BoolArray] = {}
        magnitude = np.max(np.abs(np.concatenate((self.cap, self.used), axis=1)), axis=1, initial=1.0)
        self.slack = [float(x) * _BOUND_SLACK for x in magnitude]
        # The most any node admits at all (its limit with nothing reserved): a demand above it
        # waits until the threshold is raised, however much is released.
        limit = np.max(self.limit, axis=1, initial=-np.inf) if len(nodes) else np.full(_DIMS, -np.inf)
        self.limit_bound = [float(x) + s for x, s in zip(limit.tolist(), self.slack, strict=True)]
        # Every node changed, in order (read by the shape cache): ``i`` after a commit on node i,
        # which only ever takes room away, and ``~i`` after a release, which gives room back.
        self.changes: list[int] = []
        # Nodes committed to or released on since last applied (see apply): listed once each, and
        # marked in a byte per node (a commit's membership test reads one byte, not a large set's table).
        self._touched: list[int] = []
        self._touched_mark = bytearray(len(nodes))
        self._choices: dict[tuple[object, ...], tuple[NodeTopology | None, tuple[int, ...]]] = {}   # see commit
        self._init_derived()
        self.refresh_bounds()

    def _init_dimensions(self, nodes: tuple[NodeSnapshot, ...], threshold: float, mode: str) -> None:
        """Capacity, reservations, limits and headroom per dimension and node."""
        self.cap = _columns(nodes, "capacity")
        self.used = _columns(nodes, "used")
        # Nodes whose numpy columns lag their Python mirrors (see _sync), listed once each and marked
        # in a byte per node, like the touched nodes.
        self._dirty: list[int] = []
        self._dirty_mark = bytearray(len(nodes))
        self.schedulable = np.array([node.schedulable for node in nodes], dtype=np.bool_)
        self.schedulable_list = [node.schedulable for node in nodes]
        self.factors = limit_factors(threshold, mode, shared=False)
        self.limit = np.where(self.schedulable, self._scaled(self.factors), -np.inf)
        # The dimensions in which a shared request's limit is lower, with those limits (one row each).
        shared = self._shared_factors = limit_factors(threshold, mode, shared=True)
        self.shared_dims = [k for k in range(_DIMS) if shared[k] != self.factors[k]]
        shared_limit = np.where(self.schedulable, self._scaled(shared), -np.inf)[self.shared_dims]
        self.shared_limit: FloatArray = np.ascontiguousarray(shared_limit)
        # Python mirrors of the per-node columns, one array('d') per node holding its reservations
        # (0-4), its limits (5-9) and its shared limits (_SHARED on), so that the filter for one node
        # reads one place in memory: committing reads and writes one node, and Python floats
        # round exactly like numpy float64, so both copies stay identical.
        self.rows = _rows(np.concatenate((self.used, self.limit, self.shared_limit)))
        # Headroom: ``limit - used`` for the float dimensions, ``floor(limit) - used`` for bytes.
        # Kept as an array only: a node's headroom is recomputed from it when its column is written (_sync).
        self.hlimit = self.limit.copy()
        self.hlimit[list(_BYTE_DIMS)] = np.floor(self.limit[list(_BYTE_DIMS)])
        self.headroom = self.hlimit - self.used
        # A lower bound on every schedulable node's headroom per dimension: a demand at or below
        # it fits everywhere in that dimension, so the filter skips the dimension. Commits only
        # lower headroom, so ``min(bound, new headroom)`` keeps it exact; releases leave it a bound. It is
        # lowered when the changed columns are written (_sync), before anything reads it.
        room = self.headroom[:, self.schedulable]
        self.room_min = room.min(axis=1).tolist() if room.shape[1] else [math.inf] * _DIMS
        self.exact = all(is_exact(node.used.as_tuple()) for node in nodes) and bool(
            np.all(self.cap[list(_FLOAT_DIMS)] < _DYADIC_MAX)
        )

    def _scaled(self, factors: tuple[float, ...]) -> FloatArray:
        """``factor × capacity`` per dimension and node (the same product as the scalar filter's)."""
        return np.array(factors, dtype=np.float64)[:, None] * self.cap

    def _init_power(self, nodes: tuple[NodeSnapshot, ...]) -> None:
        """The per-node values policies rank by (see :class:`NodeArrays`)."""
        n = len(nodes)
        # What a commit reads to derive a node's utilization and power, in one array('d') with
        # _POWER values per node (GPU capacity, idle W, max - idle W, 1.0 when powered on): a commit
        # on a node not read for a while then fetches them from one place in memory, not four.
        columns = np.array([self.cap[0], [node.power.idle_w for node in nodes],
                            [node.power.max_w - node.power.idle_w for node in nodes],
                            [1.0 if node.powered_on else 0.0 for node in nodes]], dtype=np.float64).reshape(_POWER, n)
        self.power_rows = array("d")
        self.power_rows.frombytes(np.ascontiguousarray(columns.T).tobytes())
        rows = np.frombuffer(self.power_rows, dtype=np.float64).reshape(n, _POWER)
        # The fields a commit changes live in array('d') buffers that the view's arrays are numpy
        # views of: a commit writes the buffers (a fraction of a numpy scalar write's cost), and the
        # vectorised passes over them read contiguous memory.
        self.util_buf = array("d", bytes(8 * n))
        self.neg_util_buf = array("d", bytes(8 * n))
        self.used_gpus_buf = array("d", self.used[0].tolist())
        self.before_buf = array("d", bytes(8 * n))
        self.view = NodeArrays(
            util=np.frombuffer(self.util_buf, dtype=np.float64),
            neg_util=np.frombuffer(self.neg_util_buf, dtype=np.float64),
            used_gpus=np.frombuffer(self.used_gpus_buf, dtype=np.float64),
            cap_gpus_safe=np.where(self.cap[0] > 0, self.cap[0], 1.0),
            idle_w=rows[:, 1].copy(),
            slope_w=rows[:, 2].copy(),
            before_w=np.frombuffer(self.before_buf, dtype=np.float64),
        )

    def _init_gpus(self, nodes: tuple[NodeSnapshot, ...]) -> None:
        """Fill the per-GPU lists, the partly-shared index and ``whole_desc`` (padded with -1)."""
        self.width = max((len(node.gpus) for node in nodes), default=0) or 1
        shape = (self.width, len(nodes))
        self.slot_ids = [[g.index for g in node.gpus] for node in nodes]
        # 1 where a node's GPU indices are its GPU positions (0, 1, ...): a commit then hands the
        # positions on as the indices without reading the node's index list.
        self.plain_ids = bytearray(ids == list(range(len(ids))) for ids in self.slot_ids)
        self.slot_total = [[g.mem_total_bytes for g in node.gpus] for node in nodes]
        self.slot_mem: list[list[float]] = [[g.mem_free_bytes for g in node.gpus] for node in nodes]
        self.slot_share = [[g.share_free for g in node.gpus] for node in nodes]
        # Topology groups per node as tuples, each distinct one kept once (commit's choice memo keys them by identity).
        self._topologies: dict[tuple[int, ...], tuple[int, ...]] = {}
        self.slot_topology = [self._topology_of(node.gpus) for node in nodes]
        self.slot_avoid = [_degraded(node.gpus) for node in nodes]
        self._partial = PartialGpus(sum(len(node.gpus) for node in nodes))
        self.whole_desc = np.full(shape, -1.0)
        self.free_desc: list[list[float]] = [[] for _ in nodes]   # whole_desc's columns as lists, unpadded

    def _init_derived(self) -> None:
        """What :meth:`_refresh_node` derives, for every node at once (same operations, same rounding)."""
        n = len(self.nodes)
        self._derive_columns(slice(None), self.used)
        for i, (shares, mems) in enumerate(zip(self.slot_share, self.slot_mem, strict=True)):
            self.free_desc[i] = _free_whole(mems, shares)
            for k, s in enumerate(shares):
                if 0.0 < s < 1.0:
                    self._partial.update(i, k, s, mems[k])
        if n:
            columns = [self._padded(free) for free in self.free_desc]
            self.whole_desc = np.ascontiguousarray(np.array(columns, dtype=np.float64).T)

    def _topology_of(self, gpus: tuple[GpuSlot, ...]) -> tuple[int, ...]:
        """The GPUs' topology groups, as the one tuple the state keeps for that value."""
        groups = tuple([g.topology_group for g in gpus])
        return self._topologies.setdefault(groups, groups)

    def _padded(self, free: list[float]) -> list[float]:
        """A ``free_desc`` list as a ``whole_desc`` column: padded with -1 to the widest node."""
        return free + [-1.0] * (self.width - len(free))

    def used_array(self) -> FloatArray:
        """The ``(5, N)`` reservation array, brought up to date from the Python mirrors.

        :returns: the array (shared; do not modify).
        """
        self._sync()
        return self.used

    def _sync(self) -> None:
        """Write the columns of the nodes changed since the last call into the numpy arrays.

        Commits update the Python mirrors only; the arrays the vectorised filter reads (``used``,
        ``headroom``, ``whole_desc``) are brought up to date here, just before they are read.
        """
        dirty = self._dirty
        if not dirty:
            return
        _unmark(self._dirty_mark, dirty)
        underived, self._underived = self._underived, False
        low = self.room_min
        if len(dirty) < _SYNC_BULK:
            hlimit, schedulable = self.hlimit, self.schedulable_list
            for i in dirty:
                u = self.rows[i]
                if underived:
                    self._derive_view(i, u)
                self.used[:, i] = u[:_DIMS]
                # ``limit - used`` per dimension, on Python floats (which round like float64)
                h = hlimit[:, i].tolist()
                room = [h[0] - u[0], h[1] - u[1], h[2] - u[2], h[3] - u[3], h[4] - u[4]]
                self.headroom[:, i] = room
                self.whole_desc[:, i] = self._padded(self.free_desc[i])
                if schedulable[i]:
                    for k in range(_DIMS):
                        if room[k] < low[k]:
                            low[k] = room[k]
        else:   # many columns (a cycle's update, a long batch): one fancy-indexed write per array
            idx = np.fromiter(dirty, dtype=np.int64, count=len(dirty))
            order = idx.tolist()
            k, width, chain = len(order), self.width, itertools.chain.from_iterable
            rows, free_desc = self.rows, self.free_desc
            # Rows joined into one array (no intermediate list per row), their reservations written transposed.
            joined = np.frombuffer(b"".join([rows[i] for i in order]), np.float64)
            used = joined.reshape(k, len(joined) // k)[:, :_DIMS].T
            if underived:
                self._derive_columns(idx, used)
            self.used[:, idx] = used
            headroom = self.hlimit[:, idx] - used
            self.headroom[:, idx] = headroom
            headroom = headroom[:, self.schedulable[idx]]
            if headroom.shape[1]:
                # fmin: a NaN leaves the bound as it is, as the comparisons of the loop above do
                self.room_min = np.fmin(np.fmin.reduce(headroom, axis=1), low).tolist()
            pads = [[-1.0] * m for m in range(width + 1)]
            free = np.fromiter(chain([part for i in order for part in (free_desc[i], pads[width - len(free_desc[i])])]),
                               np.float64, width * k)
            self.whole_desc[:, idx] = free.reshape(k, width).T
        dirty.clear()

    def _derive_columns(self, idx: IntArray | slice, used: FloatArray) -> None:
        """:meth:`_derive_view` for the nodes ``idx`` (every node: ``slice(None)``) whose reservations are the
        columns of ``used``, with numpy: the same operations as in Python, so the same rounding."""
        power = np.frombuffer(self.power_rows, dtype=np.float64).reshape(-1, _POWER)[idx].T
        cap_gpus, used_gpus = power[0], used[0]
        util = np.zeros(used.shape[1])
        np.divide(used_gpus, cap_gpus, out=util, where=cap_gpus > 0)
        view = self.view
        view.used_gpus[idx] = used_gpus
        view.util[idx] = util
        view.neg_util[idx] = -util
        reserved = np.any(used != 0, axis=0)
        view.before_w[idx] = np.where((power[3] != 0.0) & reserved, power[1] + power[2] * util, 0.0)

    def set_derive_on_commit(self, on: bool) -> None:
        """Whether a commit writes the node's utilization, GPUs reserved and power drawn into :attr:`view` at
        once (on: a policy reading them is placing) or leaves them to the next :meth:`_sync` (the columns'
        write before any vectorised read); turning it on brings every pending value up to date first.

        :param on: the policy placing now reads the view (``Policy.reads_view``).
        """
        if on and not self.derive_on_commit:
            self._sync()
        self.derive_on_commit = on

    def _refresh_node(self, i: int) -> None:
        """Recompute one node's derived entries from its Python mirrors (utilization, power, headroom, GPUs)
        after it gained room or was rewritten (a release, an applied snapshot): logged as a release.

        :param i: node index.
        """
        self._mark(i)
        self._derive_view(i, self.rows[i])
        shares, mems = self.slot_share[i], self.slot_mem[i]
        self.free_desc[i] = _free_whole(mems, shares)
        partial = self._partial
        indexed = partial.where
        for k in range(len(shares)):
            s = shares[k]
            if 0.0 < s < 1.0 or (i, k) in indexed:   # whole GPUs never enter the index
                partial.update(i, k, s, mems[k])
        self.changes.append(~i)

    def _mark(self, i: int) -> None:
        """Note that node ``i``'s reservations changed: its columns (headroom, the headroom bound) are
        written by the next :meth:`_sync`."""
        if not self._dirty_mark[i]:
            self._dirty_mark[i] = 1
            self._dirty.append(i)
        self._bounds_stale = True

    def _derive_view(self, i: int, column: array[float]) -> None:
        """Write node ``i``'s GPUs reserved, utilization and power drawn, from its reservations (``column``:
        its :attr:`rows` entry), into the view's buffers."""
        rows, j = self.power_rows, i * _POWER
        cap_gpus = rows[j]
        used_gpus = column[0]
        util = used_gpus / cap_gpus if cap_gpus > 0 else 0.0
        self.used_gpus_buf[i] = used_gpus
        self.util_buf[i] = util
        self.neg_util_buf[i] = -util
        reserved = column[0] or column[1] or column[2] or column[3] or column[4]   # any() of the reservations
        self.before_buf[i] = rows[j + 1] + rows[j + 2] * util if rows[j + 3] and reserved else 0.0

    def refresh_bounds(self) -> None:
        """Recompute the upper bounds on headroom and on free GPUs (after refusals and releases)."""
        if not self._bounds_stale:
            return
        self._bounds_stale = False
        used = self.used_array()   # also brings whole_desc up to date
        room = np.max(self.limit - used, axis=1, initial=-np.inf) if used.shape[1] else np.full(_DIMS, -1.0)
        self.room_bound = [float(r) + s for r, s in zip(room.tolist(), self.slack, strict=True)]
        # A demand at or under both bounds in every dimension passes hopeless()'s loop: checked at once.
        self._pass_bound = tuple(min(r, m) for r, m in zip(self.room_bound, self.limit_bound, strict=True))
        if self.used.shape[1]:
            self.whole_bound = np.max(self.whole_desc, axis=1).tolist()
        else:
            self.whole_bound = [-1.0] * self.width

    def hopeless(self, req: Request, values: tuple[float, int, float, int, int], whole: int) -> str | None:
        """A reason no node can possibly take the request, from the bounds alone (None: maybe one can).

        :param req: the request.
        :param values: ``req.demand.as_tuple()``.
        :param whole: ``req.whole_gpus``.
        :returns: a short reason, or None.
        """
        p = self._pass_bound
        if not (values[0] <= p[0] and values[1] <= p[1] and values[2] <= p[2] and values[3] <= p[3]
                and values[4] <= p[4]):
            reason = self._over_bound(values)
            if reason is not None:
                return reason
        if whole > self.width or (whole > 0 and self.whole_bound[whole - 1] < req.gpu_mem_per_gpu_bytes):
            return f"no node has {whole} free GPUs"
        return None

    def _over_bound(self, values: tuple[float, int, float, int, int]) -> str | None:
        """:meth:`hopeless`'s reason for the first dimension over a bound (None: none is)."""
        for name, d, bound, most, f in zip(DIMENSIONS, values, self.room_bound, self.limit_bound, self.factors,
                                           strict=True):
            if d > most:
                if f < 1.0:
                    return f"{name} over threshold on every node, even with nothing reserved on it"
                return f"{name} more than any node has"
            if d > bound:
                return f"{name} over threshold on every node" if f < 1.0 else f"{name} over capacity on every node"
        return None

    def static_mask(self, req: Request) -> BoolArray | None:
        """Nodes that match the request's GPU model and node selector, are among the nodes it may go to (when it
        names them) and not among the nodes it avoids (cached; the cache is bounded, as every service replica may
        avoid another set); None without constraints.

        :param req: the request.
        :returns: a mask over nodes (treat it as read-only), or None when the request has no constraint.
        """
        return self.static_for(req.constraint_key)

    def static_for(
        self, key: tuple[str, frozenset[tuple[str, str]], frozenset[str], frozenset[str]] | None
    ) -> BoolArray | None:
        """:meth:`static_mask` of the requests whose ``constraint_key`` is ``key``."""
        if key is None:
            return None
        mask = self._static.get(key)
        if mask is None:
            mask = np.zeros(len(self.nodes), dtype=np.bool_)
            for i, node in enumerate(self.nodes):
                model_ok = not key[0] or key[0] in node.gpu_model.lower()
                mask[i] = (model_ok and node.node_id not in key[2] and (not key[3] or node.node_id in key[3])
                           and all(node.labels.get(k) == v for k, v in key[1]))
            if len(self._static) >= _STATIC_CACHE:
                self._static.clear()
            self._static[key] = mask
        return mask

    def dimension_ok(self, req: Request, demand: FloatArray) -> BoolArray:
        """Per dimension and node: does ``used + demand <= limit`` hold? (a reused buffer).

        When every value is exact (see :func:`is_exact`), ``demand <= headroom`` gives the same
        answer with one comparison instead of an addition and a comparison.

        :param req: the request.
        :param demand: its vector as an array, shape ``(5,)``.
        :returns: a ``(5, N)`` boolean array, valid until the next call.
        """
        self._sync()
        if self.exact and is_exact(req.demand.as_tuple()):
            ok = np.greater_equal(self.headroom, demand[:, None], out=self._ok_buf)
        else:
            np.add(self.used_array(), demand[:, None], out=self._sum_buf)
            ok = np.less_equal(self._sum_buf, self.limit, out=self._ok_buf)
        if self.shared_dims and req.whole_gpus == 0 and demand[0] > 0:
            for row, k in enumerate(self.shared_dims):
                ok[k] &= self.used[k] + demand[k] <= self.shared_limit[row]
        return ok

    def shared_ok(self, values: tuple[float, int, float, int, int]) -> BoolArray:
        """Nodes where a shared request stays under the limits only shared requests have (:attr:`shared_dims`).

        :param values: the shared request's demand vector.
        :returns: a fresh mask over nodes (all True when no dimension is tighter for shared requests).
        """
        self._sync()
        mask = np.ones(len(self.nodes), dtype=np.bool_)
        for row, k in enumerate(self.shared_dims):
            mask &= self.used[k] + values[k] <= self.shared_limit[row]
        return mask

    def gpu_ok(self, req: Request, whole: int) -> BoolArray | None:
        """Nodes whose GPUs can hold the request, None when it needs no GPU.

        :param req: the request.
        :param whole: ``req.whole_gpus``.
        :returns: a mask over nodes, or None.
        """
        self._sync()
        per_gpu = req.gpu_mem_per_gpu_bytes
        if whole > 0:
            if whole > self.width:
                return np.zeros(len(self.nodes), dtype=np.bool_)
            return self.whole_desc[whole - 1] >= per_gpu
        share = req.demand.gpus
        if share <= 0:
            return None
        # A fully free GPU holds any share, so only nodes with partly shared GPUs need a closer look.
        ok = self.whole_desc[0] >= per_gpu
        self._partial.mark(ok, share, per_gpu)
        return ok

    def _binding_dims_mask(self, demand: tuple[float, int, float, int, int]) -> BoolArray:
        """Exact-mode filter over the dimensions where the demand exceeds :attr:`room_min`."""
        dims = [k for k in range(_DIMS) if demand[k] > self.room_min[k]]
        if not dims:
            return self.schedulable.copy()
        mask = self.headroom[dims[0]] >= demand[dims[0]]
        for k in dims[1:]:
            mask &= self.headroom[k] >= demand[k]
        return mask

    def feasible_mask(self, req: Request, values: tuple[float, int, float, int, int], whole: int,
                      exact: bool) -> BoolArray:
        """Every node the shared filter accepts for the request (constraints, dimensions, GPUs).

        :param req: the request.
        :param values: ``req.demand.as_tuple()``.
        :param whole: ``req.whole_gpus``.
        :param exact: ``is_exact(values)``.
        :returns: a fresh mask over nodes.
        """
        self._sync()
        if self.exact and exact:
            mask = self._binding_dims_mask(values)
        else:
            # General path: add and compare, rounding exactly like the reference.
            # all() over axis 0 of the 2-D per-dimension mask is one bool per node (the stubs allow a scalar).
            mask = cast(BoolArray, self.dimension_ok(req, np.array(values, dtype=np.float64)).all(axis=0))
        if self.shared_dims and whole == 0 and values[0] > 0:
            mask &= self.shared_ok(values)
        static = self.static_mask(req)
        if static is not None:
            mask &= static
        gpu = self.gpu_ok(req, whole)
        if gpu is not None:
            mask &= gpu
        return mask

    def fits(
        self, i: int, values: tuple[float, int, float, int, int], whole: int, per_gpu: int, static: BoolArray | None
    ) -> bool:
        """Whether node ``i`` passes the filter now: the scalar form of :meth:`feasible_mask` for one node.

        The dimensions are compared as the reference does (``used + demand <= limit``), which
        the vectorised filter's exact-mode headroom comparison agrees with.

        :param i: node index.
        :param values: the demand vector.
        :param whole: whole GPUs needed.
        :param per_gpu: memory each GPU must have free.
        :param static: :meth:`static_mask` for the request.
        :returns: True when the request may go on the node.
        """
        if static is not None and not static[i]:
            return False
        u = self.rows[i]
        if not (
            u[0] + values[0] <= u[5]
            and u[1] + values[1] <= u[6]
            and u[2] + values[2] <= u[7]
            and u[3] + values[3] <= u[8]
            and u[4] + values[4] <= u[9]
        ):
            return False
        if (whole == 0 and values[0] > 0 and self.shared_dims
                and not all(u[k] + values[k] <= u[_SHARED + row] for row, k in enumerate(self.shared_dims))):
            return False
        if whole > 0:
            free = self.free_desc[i]
            return len(free) >= whole and free[whole - 1] >= per_gpu
        share = values[0]
        if share <= 0:
            return True
        free = self.free_desc[i]
        if free and free[0] >= per_gpu:   # a fully free GPU with the memory holds any share
            return True
        return any(s >= share and m >= per_gpu for m, s in zip(self.slot_mem[i], self.slot_share[i], strict=True))

    def checker(
        self, values: tuple[float, int, float, int, int], whole: int, per_gpu: int,
        constraints: tuple[str, frozenset[tuple[str, str]], frozenset[str], frozenset[str]] | None,
    ) -> Callable[[int], bool]:
        """:meth:`fits` for one request shape, as a function of the node alone (what the shape cache
        re-checks changed nodes with): the same comparisons, with the shape's values bound once.

        :param values: the demand vector.
        :param whole: whole GPUs needed.
        :param per_gpu: memory each GPU must have free.
        :param constraints: the requests' ``constraint_key`` (None: none); its :meth:`static_for`
            mask is read at each call, so a change of labels is seen.
        :returns: ``check(i)``, True when the request may go on node ``i`` now.
        """
        if constraints is not None:
            def constrained(i: int) -> bool:
                return self.fits(i, values, whole, per_gpu, self.static_for(constraints))
            return constrained
        rows, free_desc = self.rows, self.free_desc
        v0, v1, v2, v3, v4 = values
        if whole > 0:
            last = whole - 1

            def whole_gpus(i: int) -> bool:
                # The GPUs first: after a commit on the node they are what most often no longer fits.
                free = free_desc[i]
                if len(free) > last and free[last] >= per_gpu:
                    u = rows[i]
                    return (u[0] + v0 <= u[5] and u[1] + v1 <= u[6] and u[2] + v2 <= u[7]
                            and u[3] + v3 <= u[8] and u[4] + v4 <= u[9])
                return False
            return whole_gpus
        if v0 <= 0:
            def no_gpu(i: int) -> bool:
                u = rows[i]
                return (u[0] + v0 <= u[5] and u[1] + v1 <= u[6] and u[2] + v2 <= u[7] and u[3] + v3 <= u[8]
                        and u[4] + v4 <= u[9])
            return no_gpu
        pairs = tuple((_SHARED + row, k) for row, k in enumerate(self.shared_dims))
        slot_mem, slot_share = self.slot_mem, self.slot_share
        if pairs == ((_SHARED, 0), (_SHARED + 1, 1)):
            # The usual case (whole-gpus mode, threshold below 1): the GPU count and GPU memory have
            # lower limits for a shared request, compared here without a loop.
            def shared_gpu_dims(i: int) -> bool:
                u = rows[i]
                if not (u[0] + v0 <= u[5] and u[1] + v1 <= u[6] and u[2] + v2 <= u[7]
                        and u[3] + v3 <= u[8] and u[4] + v4 <= u[9]):
                    return False
                if not (u[0] + v0 <= u[10] and u[1] + v1 <= u[11]):
                    return False
                free = free_desc[i]
                if free and free[0] >= per_gpu:   # a fully free GPU with the memory holds any share
                    return True
                for m, s in zip(slot_mem[i], slot_share[i], strict=True):  # noqa: SIM110 - cheaper than any()
                    if s >= v0 and m >= per_gpu:
                        return True
                return False
            return shared_gpu_dims

        def shared_gpu(i: int) -> bool:
            u = rows[i]
            if not (u[0] + v0 <= u[5] and u[1] + v1 <= u[6] and u[2] + v2 <= u[7] and u[3] + v3 <= u[8]
                    and u[4] + v4 <= u[9]):
                return False
            for at, k in pairs:
                if not u[k] + values[k] <= u[at]:
                    return False
            free = free_desc[i]
            if free and free[0] >= per_gpu:   # a fully free GPU with the memory holds any share
                return True
            for m, s in zip(slot_mem[i], slot_share[i], strict=True):  # noqa: SIM110 - cheaper than any()
                if s >= v0 and m >= per_gpu:
                    return True
            return False
        return shared_gpu

    def commit(
        self, i: int, req: Request, demand: tuple[float, int, float, int, int], whole: int, exact: bool
    ) -> NodeAssignment:
        """Reserve a request on node ``i``: choose its GPUs and update the arrays.

        The node's rows (``rows``, ``free_desc``, the GPU lists) are updated in
        place: a batch then leaves no new lists behind for the garbage collector to walk.

        :param i: node index.
        :param req: the request.
        :param demand: ``req.demand.as_tuple()``.
        :param whole: ``req.whole_gpus``.
        :param exact: ``is_exact(req.demand.as_tuple())``; False leaves the headroom shortcut for good.
        :returns: the node's part of the placement.
        :raises PlacementError: when the node's GPUs cannot hold it (the filter said they could).
        """
        mem, share_free = self.slot_mem[i], self.slot_share[i]
        per_gpu = req.gpu_mem_per_gpu_bytes
        free = self.free_desc[i]
        positions: tuple[int, ...] | None
        if whole > 0 and len(free) == whole and free[-1] >= per_gpu:
            # Exactly the GPUs asked for are fully free, all with the memory: every rule of the
            # allocator takes all of them (ascending), whatever the topology.
            count = len(share_free)
            if whole == count:   # every GPU of the node
                positions = _ALL.get(count) or _ALL.setdefault(count, _shared(tuple(range(count))))
            else:
                positions = _shared(tuple([k for k, s in enumerate(share_free) if s >= 1.0]))
        else:
            # The allocator's choice is a function of the node's GPU state and the request's GPU needs,
            # which repeat across nodes and requests: remembered by value (the links by identity, held;
            # the topology groups by identity too, each distinct tuple kept once by the state).
            links = self.nodes[i].topology
            topology = self.slot_topology[i]
            avoid = self.slot_avoid[i]
            key = (whole, demand[0], per_gpu, id(links), id(topology), avoid, *mem, *share_free)
            known = self._choices.get(key)
            if known is not None and known[0] is links:
                positions = known[1]
            else:
                positions = choose_gpu_indices(mem, share_free, topology, whole=whole, share=demand[0],
                                               mem_per_gpu=per_gpu, links=links, avoid=avoid)
                if positions is None:
                    raise PlacementError(f"node {self.nodes[i].node_id!r} has no GPUs left for task {req.task_id!r}")
                if len(self._choices) >= _CHOICES_MAX:
                    self._choices.clear()
                positions = _shared(positions)
                self._choices[key] = (links, positions)
        if not exact:
            self.exact = False
        if whole > 0:
            # Whole GPUs were fully free (so never in the shared index) and are fully taken (so not
            # in it after either): the node's free list loses exactly their memory values.
            share = 1.0
            everything = len(positions) == len(free)   # every fully free GPU: none is left
            if everything:
                free.clear()
            for k in positions:
                m = mem[k]
                if not everything:
                    free.remove(m)
                m -= per_gpu
                mem[k] = 0 if m < 0 else m            # take_gpu, inline
                s = share_free[k] - 1.0
                share_free[k] = 0.0 if s < 0.0 else s
        elif positions:
            share = demand[0]
            (k,) = positions
            before_mem, before = mem[k], share_free[k]
            mem[k], share_free[k] = take_gpu(before_mem, before, per_gpu, share)
            if before >= 1.0:   # a fully free GPU taken in part leaves the free list
                if share_free[k] < 1.0:
                    free.remove(before_mem)
                else:
                    self.free_desc[i] = _free_whole(mem, share_free)
            s = share_free[k]
            if 0.0 < s < 1.0 or (i, k) in self._partial.where:
                self._partial.update(i, k, s, mem[k])
        else:
            share = demand[0]
        u = self.rows[i]
        u[0] += demand[0]
        u[1] += demand[1]
        u[2] += demand[2]
        u[3] += demand[3]
        u[4] += demand[4]
        self._mark(i)
        if self.derive_on_commit:
            self._derive_view(i, u)
        else:   # the view's values wait for _sync: no policy placing now reads them
            self._underived = True
        self.changes.append(i)
        if not self._touched_mark[i]:
            self._touched_mark[i] = 1
            self._touched.append(i)
        if self.plain_ids[i]:
            indices = positions   # (shared already)
        else:
            ids = self.slot_ids[i]
            indices = _shared(tuple([ids[k] for k in positions]))
        return new_assignment(self.node_ids[i], indices, share)

    def release(self, assignment: NodeAssignment, demand: Resources, per_gpu: int) -> None:
        """Give back what :meth:`commit` reserved (a task ended).

        :param assignment: the node's part of a placement.
        :param demand: the vector reserved on the node.
        :param per_gpu: memory reserved on each of its GPUs.
        :raises PlacementError: when the node or one of its GPUs is not in this state.
        """
        i = self.index.get(assignment.node_id)
        if i is None or not set(assignment.gpu_indices) <= set(self.slot_ids[i]):
            raise PlacementError(f"node {assignment.node_id!r} or its GPUs {assignment.gpu_indices} are unknown")
        mem, share_free = self.slot_mem[i], self.slot_share[i]
        for gpu_index in assignment.gpu_indices:
            k = self.slot_ids[i].index(gpu_index)
            mem[k], share_free[k] = give_back_gpu(mem[k], share_free[k], per_gpu, assignment.gpu_share,
                                                  self.slot_total[i][k])
        values = demand.as_tuple()
        self.exact = self.exact and is_exact(values)
        row = self.rows[i]
        for k, d in enumerate(values):
            x = row[k] - d
            row[k] = 0.0 if abs(x) < CRUMB else x
        self._refresh_node(i)
        if not self._touched_mark[i]:
            self._touched_mark[i] = 1
            self._touched.append(i)
        self.refresh_bounds()

    def matches(self, i: int, node: NodeSnapshot) -> bool:
        """Whether node ``i`` of this state is ``node`` already (its reservations, GPUs and everything
        placement reads), so that applying ``node`` would change nothing.

        :param i: node index.
        :param node: a snapshot of the node with the same id.
        :returns: True when nothing differs.
        """
        old = self.nodes[i]
        if node is old:
            return not self._touched_mark[i]
        used, u = node.used, self.rows[i]
        if (used.gpus != u[0] or used.gpu_mem_total_bytes != u[1] or used.cpu_cores != u[2] or used.mem_bytes != u[3]
                or used.disk_bytes != u[4]):
            return False
        gpus = node.gpus
        # Two list comparisons (in C) rather than a loop over the GPUs.
        if ([g.mem_free_bytes for g in gpus] != self.slot_mem[i]
                or [g.share_free for g in gpus] != self.slot_share[i]):
            return False
        if gpus is not old.gpus and (
            [g.index for g in gpus] != self.slot_ids[i]
            or [g.mem_total_bytes for g in gpus] != self.slot_total[i]
            or tuple([g.topology_group for g in gpus]) != self.slot_topology[i]
            or _degraded(gpus) != self.slot_avoid[i]
        ):
            return False
        # Snapshots of one node usually share these objects (the snapshot builder keeps its inventory
        # part): identity answers first, equality where they differ.
        if node.capacity is not old.capacity and node.capacity != old.capacity:
            return False
        if node.power is not old.power and node.power != old.power:
            return False
        if node.labels is not old.labels and node.labels != old.labels:
            return False
        if node.topology is not old.topology and node.topology != old.topology:
            return False
        return (node.node_id == old.node_id and node.powered_on == old.powered_on
                and node.schedulable == old.schedulable and node.gpu_model == old.gpu_model)

    def touched(self, i: int) -> bool:
        """Whether node ``i`` was committed to or released on since it was last applied or built."""
        return bool(self._touched_mark[i])

    def touched_nodes(self) -> list[int]:
        """Every node committed to or released on since it was last applied or built, once each (do not modify)."""
        return self._touched

    def mark_applied(self) -> None:
        """Note that every node now holds what its last snapshot says (the start of a cycle)."""
        _unmark(self._touched_mark, self._touched)
        self._touched.clear()

    def apply(self, nodes: Iterable[NodeSnapshot]) -> bool:
        """Bring the state to new snapshots of some of its nodes (a persistent state's per-cycle update).

        Each node, found by id, takes everything the snapshot says: reservations, per-GPU free memory
        and share, capacity and limits, power curve and power state, schedulability, model, labels,
        topology. It is logged as a release in :attr:`changes` (so every shape entry re-checks it)
        and the bounds are recomputed. The result is what a state built from the full snapshot
        holds (``tests/unit/coordinator/scheduler/test_live_state.py`` checks it).

        :param nodes: snapshots of nodes this state has (same ids).
        :returns: False, having changed nothing, when a node is unknown or has more GPUs than it had
            (the caller builds a new state); True when applied.
        """
        changed: list[tuple[int, NodeSnapshot]] = []
        for node in nodes:
            i = self.index.get(node.node_id)
            if i is None or len(node.gpus) > len(self.slot_ids[i]):   # a GPU more: the indexes are sized at build
                return False
            changed.append((i, node))
        if not changed:
            return True
        labels_changed = False
        columns: dict[int, tuple[list[float], list[float], list[float], list[float]]] = {}
        for i, node in changed:
            old = self.nodes[i]
            labels_changed = labels_changed or (node.labels != old.labels or node.gpu_model != old.gpu_model)
            self._apply_node(i, node, columns)
        self._write_columns(columns)
        if labels_changed:
            self._static.clear()
        self._after_apply()
        return True

    def _apply_node(self, i: int, node: NodeSnapshot,
                    columns: dict[int, tuple[list[float], list[float], list[float], list[float]]]) -> None:
        """Write one node's snapshot into the lists (see :meth:`apply`); its capacity, limit, shared
        limit and headroom limit go into ``columns``, for :meth:`_write_columns` to write into the arrays."""
        self.nodes[i] = node
        cap = [float(x) for x in node.capacity.as_tuple()]
        schedulable = node.schedulable
        self.schedulable_list[i] = schedulable
        # The products and floors of _init_dimensions, on Python floats (which round like float64).
        if schedulable:
            limit = [f * c for f, c in zip(self.factors, cap, strict=True)]
            shared = [self._shared_factors[k] * cap[k] for k in self.shared_dims]
        else:
            limit = [-math.inf] * _DIMS
            shared = [-math.inf] * len(self.shared_dims)
        hlimit = limit.copy()
        for k in _BYTE_DIMS:
            x = hlimit[k]
            hlimit[k] = float(math.floor(x)) if math.isfinite(x) else x
        columns[i] = (cap, limit, shared, hlimit)
        row = self.rows[i] = array("d", node.used.as_tuple())
        row.extend(limit)
        row.extend(shared)
        self.exact = self.exact and is_exact(node.used.as_tuple()) and cap[0] < _DYADIC_MAX and cap[2] < _DYADIC_MAX
        j = i * _POWER
        self.power_rows[j : j + _POWER] = array("d", (cap[0], node.power.idle_w, node.power.max_w - node.power.idle_w,
                                                      1.0 if node.powered_on else 0.0))
        old_count = len(self.slot_ids[i])
        gpus = node.gpus
        ids = self.slot_ids[i] = [g.index for g in gpus]
        self.plain_ids[i] = ids == list(range(len(ids)))
        self.slot_total[i] = [g.mem_total_bytes for g in gpus]
        self.slot_mem[i] = [g.mem_free_bytes for g in gpus]
        self.slot_share[i] = [g.share_free for g in gpus]
        self.slot_topology[i] = self._topology_of(gpus)
        self.slot_avoid[i] = _degraded(gpus)
        for k in range(len(gpus), old_count):   # GPUs the node no longer has leave the shared index
            self._partial.update(i, k, 0.0, 0.0)
        self._refresh_node(i)

    def _write_columns(self, columns: dict[int, tuple[list[float], list[float], list[float], list[float]]]) -> None:
        """Write applied nodes' capacity, limits, schedulability and power into the arrays, one
        fancy-indexed assignment per array."""
        idx = np.fromiter(columns, dtype=np.int64, count=len(columns))
        order = idx.tolist()
        rows = list(columns.values())
        cap = np.array([r[0] for r in rows], dtype=np.float64).T
        self.cap[:, idx] = cap
        self.limit[:, idx] = np.array([r[1] for r in rows], dtype=np.float64).T
        self.hlimit[:, idx] = np.array([r[3] for r in rows], dtype=np.float64).T
        if self.shared_dims:
            self.shared_limit[:, idx] = np.array([r[2] for r in rows], dtype=np.float64).T
        self.schedulable[idx] = [self.schedulable_list[i] for i in order]
        view = self.view
        view.cap_gpus_safe[idx] = np.where(cap[0] > 0, cap[0], 1.0)
        power = self.power_rows
        view.idle_w[idx] = [power[i * _POWER + 1] for i in order]
        view.slope_w[idx] = [power[i * _POWER + 2] for i in order]

    def _after_apply(self) -> None:
        """The whole-cluster values that :meth:`apply` may have moved: bounds, slack, exactness."""
        # The largest magnitude per dimension over capacity and reservations (as at build), without
        # concatenating the two arrays.
        magnitude = np.maximum(np.max(np.abs(self.cap), axis=1, initial=1.0),
                               np.max(np.abs(self.used_array()), axis=1, initial=1.0))
        self.slack = [float(x) * _BOUND_SLACK for x in magnitude]
        n = len(self.nodes)
        limit = np.max(self.limit, axis=1, initial=-np.inf) if n else np.full(_DIMS, -np.inf)
        self.limit_bound = [float(x) + s for x, s in zip(limit.tolist(), self.slack, strict=True)]
        self._bounds_stale = True
        self.refresh_bounds()

    def used_of(self, i: int) -> tuple[float, float, float, float, float]:
        """Node ``i``'s reservations now, in :data:`~coordinator.domain.DIMENSIONS` order.

        :param i: node index.
        :returns: the five values.
        """
        return tuple(self.rows[i][:_DIMS])  # type: ignore[return-value]

    def gpu_slots(self, i: int) -> tuple[GpuSlot, ...]:
        """Node ``i``'s GPUs with their current free memory and share.

        :param i: node index.
        :returns: the GPU slots.
        """
        return tuple(
            replace(gpu, mem_free_bytes=int(self.slot_mem[i][k]), share_free=float(self.slot_share[i][k]))
            for k, gpu in enumerate(self.nodes[i].gpus)
        )

    def node_snapshot(self, i: int) -> NodeSnapshot:
        """Node ``i`` as a plain snapshot with its current reservations.

        :param i: node index.
        :returns: the node.
        """
        u = self.rows[i]
        used = Resources(float(u[0]), int(u[1]), float(u[2]), int(u[3]), int(u[4]))
        return replace(self.nodes[i], used=used, gpus=self.gpu_slots(i))
