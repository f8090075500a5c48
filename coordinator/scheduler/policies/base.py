"""What every placement policy shares: the threshold filter, the vectorised node view, the protocol.

A policy is two steps (CONTRIBUTING.md, Placement policies). The **filter** (:func:`feasible`) is the same for every
policy here: a request may go on a node when, after placement, every resource dimension stays
at or under its limit (:func:`limit_factors`: ``threshold × capacity`` where the threshold
applies, the whole capacity elsewhere), the node satisfies the request's constraints, and the
node has GPUs that can hold it. The **rank** is what differs between policies.

Which dimensions the threshold caps is the threshold mode (:data:`THRESHOLD_MODES`):

* ``whole-gpus`` (the default): host CPU, host memory and disk always; the GPU dimensions (GPU
  count and GPU memory) only for a request for a share of a GPU. A request for whole GPUs (or
  for none) may take every GPU of a node, so an 8-GPU node runs an 8-GPU task and no whole GPU
  is left stranded under the cap.
* ``paper``: every dimension for every request, GPU count included (paper Alg. 1-3), for
  replays that reproduce the paper.

The placement engine keeps the cluster in numpy arrays (:class:`NodeArrays`) and asks the policy
to ``select`` among the nodes its vectorised filter kept; the scalar ``feasible``/``rank`` pair
is the readable form of the same decision and is what the unit tables check.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, cast

import numpy as np
import numpy.typing as npt

from common.errors import ValidationError
from common.types import DEFAULT_THRESHOLD, DEFAULT_THRESHOLD_MODE, THRESHOLD_MODES
from coordinator.domain import DIMENSIONS, NodeId, NodeSnapshot, Request

__all__ = [
    "DEFAULT_THRESHOLD",
    "DEFAULT_THRESHOLD_MODE",
    "THRESHOLD_MODES",
    "BoolArray",
    "FloatArray",
    "IntArray",
    "KeyedPolicy",
    "NodeArrays",
    "NodeFields",
    "NodeRow",
    "Policy",
    "PolicyArgs",
    "RankKey",
    "ShapeIndex",
    "constraint_reason",
    "dimension_reason",
    "feasible",
    "first_k_by_key",
    "first_k_keyed",
    "gpu_fit_reason",
    "is_shared",
    "limit_factors",
    "node_arrays",
    "select_best",
    "validate_threshold",
    "validate_threshold_mode",
]

PAPER = "paper"

FloatArray = npt.NDArray[np.float64]
"""A float64 array with one entry per node (or per dimension × node)."""
BoolArray = npt.NDArray[np.bool_]
"""A boolean mask with one entry per node."""
IntArray = npt.NDArray[np.int64]
"""An int64 array of node indices."""

_GIB = 1024**3


def validate_threshold(threshold: float) -> None:
    """Check a policy threshold.

    :param threshold: the cap on utilization after placement.
    :raises ValidationError: unless ``0 < threshold ≤ 1`` and finite.
    """
    numeric = isinstance(threshold, int | float) and not isinstance(threshold, bool)
    if not numeric or not math.isfinite(threshold) or not 0.0 < threshold <= 1.0:
        raise ValidationError("policy.threshold", f"must be in (0, 1], got {threshold!r}")


def validate_threshold_mode(mode: str) -> None:
    """Check a threshold mode.

    :param mode: one of :data:`THRESHOLD_MODES`.
    :raises ValidationError: on any other value.
    """
    if mode not in THRESHOLD_MODES:
        raise ValidationError("policy.threshold_mode", f"must be one of {', '.join(THRESHOLD_MODES)}, got {mode!r}")


def is_shared(req: Request) -> bool:
    """Whether a request asks for a share of one GPU (not whole GPUs, not none).

    :param req: the request.
    :returns: True for a shared fraction.
    """
    return req.whole_gpus == 0 and req.demand.gpus > 0


def limit_factors(threshold: float, mode: str, shared: bool) -> tuple[float, float, float, float, float]:
    """The threshold rule: per dimension, the fraction of a node's capacity a request may bring it to.

    A node's limit in dimension ``k`` is ``factors[k] × capacity[k]``, and a request may go on it when
    ``used + demand <= limit`` holds in every dimension. The factor is ``threshold`` where the
    threshold applies and 1.0 (the whole capacity, exactly) where it does not: in ``paper`` mode it
    applies everywhere; in ``whole-gpus`` mode to host CPU, memory and disk, and to the GPU count
    and GPU memory only for a shared request. This is the only place the rule is written; the
    vectorised filter, the scalar filter and the refusal reasons all take their limits from it.

    :param threshold: the policy's threshold.
    :param mode: one of :data:`THRESHOLD_MODES`.
    :param shared: the request asks for a share of a GPU (:func:`is_shared`).
    :returns: one factor per dimension, in :data:`~coordinator.domain.DIMENSIONS` order.
    """
    if mode == PAPER or shared:
        return (threshold, threshold, threshold, threshold, threshold)
    return (1.0, 1.0, threshold, threshold, threshold)


@dataclass(frozen=True, slots=True)
class PolicyArgs:
    """Arguments every policy takes, validated when built.

    :param threshold: cap on the capped dimensions' utilization after placement, in (0, 1].
    :param threshold_mode: which dimensions the threshold caps (:data:`THRESHOLD_MODES`).
    """

    threshold: float = DEFAULT_THRESHOLD
    threshold_mode: str = DEFAULT_THRESHOLD_MODE

    def __post_init__(self) -> None:
        validate_threshold(self.threshold)
        validate_threshold_mode(self.threshold_mode)


@dataclass(slots=True)
class NodeArrays:
    """The engine's vectorised view of the nodes that policies rank (one entry per node).

    :param util: compute utilization ``used_gpus / capacity_gpus`` (0 without GPUs).
    :param neg_util: ``-util``, kept alongside so descending-utilization ranks need no negation per request.
    :param used_gpus: GPUs reserved.
    :param cap_gpus_safe: GPU capacity with 0 replaced by 1 (the filter already drops GPU
        requests on GPU-less nodes, so the substitute never reaches a choice).
    :param idle_w: power curve intercept per node.
    :param slope_w: ``max_w - idle_w`` per node.
    :param before_w: predicted power now: ``idle + slope·util`` when awake, 0 when asleep
        (powered off, or nothing allocated).
    """

    util: FloatArray
    neg_util: FloatArray
    used_gpus: FloatArray
    cap_gpus_safe: FloatArray
    idle_w: FloatArray
    slope_w: FloatArray
    before_w: FloatArray


class NodeRow:
    """One node of a :class:`NodeArrays`, its fields read as Python floats when asked for.

    A ranking key written as arithmetic over the fields gives, on a row, the value it gives for
    that node on the whole arrays (``+ - * /`` round the same on a float and on a float64 entry).

    :param view: the arrays.
    :param i: the node's index in them.
    """

    __slots__ = ("_i", "_view")

    def __init__(self, view: NodeArrays, i: int) -> None:
        self._view = view
        self._i = i

    @property
    def util(self) -> float:
        """See :attr:`NodeArrays.util`."""
        return self._view.util.item(self._i)

    @property
    def neg_util(self) -> float:
        """See :attr:`NodeArrays.neg_util`."""
        return self._view.neg_util.item(self._i)

    @property
    def used_gpus(self) -> float:
        """See :attr:`NodeArrays.used_gpus`."""
        return self._view.used_gpus.item(self._i)

    @property
    def cap_gpus_safe(self) -> float:
        """See :attr:`NodeArrays.cap_gpus_safe`."""
        return self._view.cap_gpus_safe.item(self._i)

    @property
    def idle_w(self) -> float:
        """See :attr:`NodeArrays.idle_w`."""
        return self._view.idle_w.item(self._i)

    @property
    def slope_w(self) -> float:
        """See :attr:`NodeArrays.slope_w`."""
        return self._view.slope_w.item(self._i)

    @property
    def before_w(self) -> float:
        """See :attr:`NodeArrays.before_w`."""
        return self._view.before_w.item(self._i)


NodeFields = NodeArrays | NodeRow
"""What a ranking key is evaluated on: every node's fields as arrays, or one node's as floats."""


def node_arrays(nodes: Sequence[NodeSnapshot]) -> NodeArrays:
    """The :class:`NodeArrays` of snapshot nodes, computed as the placement state computes them.

    :param nodes: the nodes, in snapshot order.
    :returns: one entry per node.
    """
    n = len(nodes)
    cap = np.array([node.capacity.gpus for node in nodes], dtype=np.float64)
    used = np.array([node.used.gpus for node in nodes], dtype=np.float64)
    idle = np.array([node.power.idle_w for node in nodes], dtype=np.float64)
    slope = np.array([node.power.max_w - node.power.idle_w for node in nodes], dtype=np.float64)
    util = np.zeros(n)
    np.divide(used, cap, out=util, where=cap > 0)
    awake = np.array([node.powered_on and not node.used.is_zero() for node in nodes], dtype=np.bool_)
    return NodeArrays(util=util, neg_util=-util, used_gpus=used, cap_gpus_safe=np.where(cap > 0, cap, 1.0),
                      idle_w=idle, slope_w=slope, before_w=np.where(awake, idle + slope * util, 0.0))


class ShapeIndex(Protocol):
    """What the engine's shape cache keeps for one request shape
    (:class:`~coordinator.scheduler.placement.shape_cache.ShapeEntry`), as policies read it."""

    mask: BoolArray
    """Feasible nodes (read-only)."""
    keyed: FloatArray | None
    """The :meth:`Policy.rank_key` key on feasible nodes, +inf elsewhere (None without a rank key)."""

    def confirm(self, i: int) -> bool:
        """Whether node ``i``, feasible in ``mask``, is feasible now (for ``confirms_lazily`` policies:
        a node committed to since may no longer be; it is then dropped from ``mask``)."""

    def best(self) -> int:
        """The feasible node with the smallest key (ties: the earlier), -1 when none is feasible."""

    def first_k(self, count: int) -> IntArray:
        """Up to ``count`` feasible nodes by ascending key, ties in node order."""

    feasible: int
    """How many nodes ``mask`` holds feasible."""

    @property
    def flags(self) -> bytearray:
        """``mask`` as bytes (1: feasible; read-only), at least as long as ``mask``."""

    def nth(self, rem: int) -> int:
        """The ``rem``-th of the feasible nodes in node order (``0 <= rem < feasible``)."""

    def set_aside(self, i: int) -> None:
        """Read feasible node ``i`` as refused (``mask``, ``flags``, ``feasible``) until :meth:`put_back`."""

    def put_back(self, nodes: list[int]) -> None:
        """Undo :meth:`set_aside` for each of ``nodes``."""

    def first_from(self, start: int, stop: int = -1) -> int:
        """The first node ``mask`` holds feasible in ``[start, stop)`` (``stop`` -1: to the end), -1 when none."""


class RankKey(Protocol):
    """A per-node key the shape cache keeps per request shape (:meth:`Policy.rank_key`): smaller is
    tried first, ties in node order. Both forms give the same value for a node, bit for bit."""

    def key_array(self, view: NodeArrays, req: Request) -> FloatArray:
        """The key of every node."""

    def key_at(self, view: NodeArrays, req: Request, i: int) -> float:
        """``key_array(view, req)[i]``, computed for node ``i`` alone."""


class Policy(Protocol):
    """A placement policy: a filter, a rank, and a vectorised selection over :class:`NodeArrays`."""

    name: str
    threshold: float
    threshold_mode: str
    sorts_requests: bool
    """True when the batch is processed by descending compute demand (Alg. 1-3), else in queue order."""
    scale_out: bool
    """True when a request no node can take asks the node provider for a new node."""
    confirms_lazily: bool
    """True when ``select_indexed`` (for one node) calls ``entry.confirm`` on each node it would choose
    and looks on when that says no, so the shape cache may leave nodes committed to un-rechecked."""
    ranked_by_key: bool
    """True for a :class:`KeyedPolicy`: ``select`` takes the feasible nodes with the smallest
    ``key_array`` (ties: earlier node), so the engine keeps the key per request shape and updates
    it node by node."""
    reads_view: bool
    """True when choosing reads the view's utilization, GPUs reserved or power drawn (:class:`NodeArrays`):
    the state then writes them at each commit; False lets it write them in bulk before the next
    vectorised read."""
    varies_key: bool
    """True when the rank key depends on more than the request's shape (the request's expected end, the
    policy's memory): the shape cache then asks :meth:`shape_variant` for each request and keeps one
    entry per shape and variant."""

    def feasible(self, req: Request, node: NodeSnapshot) -> str | None:
        """Short reason the request may not go on the node, None when it may."""

    def rank(self, req: Request, nodes: Sequence[NodeSnapshot]) -> list[NodeId]:
        """Node ids in the order this policy tries them."""

    def select(self, view: NodeArrays, mask: BoolArray, req: Request) -> IntArray:
        """Indices of up to ``req.nodes`` feasible nodes (``mask``), in choice order."""

    def committed(self, indices: IntArray, n_nodes: int) -> None:
        """Note that the engine placed a request on these node indices (policy state, if any)."""

    def rank_key(self) -> RankKey | None:
        """The per-node key the shape cache keeps for this policy's requests (None: it keeps none)."""

    def shape_variant(self, req: Request) -> object:
        """For a ``varies_key`` policy, called once per request before its shape entry is looked up:
        what else the rank key depends on for it (hashable; requests of one shape and variant share
        keys). The key's forms then apply to this request until the next call."""

    def select_indexed(self, view: NodeArrays, entry: ShapeIndex, req: Request) -> IntArray:
        """``select`` from the shape cache's entry for the request (its mask, and its block index)."""

    def select_one(self, view: NodeArrays, entry: ShapeIndex, req: Request) -> int:
        """:meth:`select_indexed` for a one-node request, as a node index (-1: none); the same choice."""

    def committed_one(self, i: int, n_nodes: int) -> None:
        """:meth:`committed` for a one-node placement on node ``i``."""


def first_k_keyed(keyed: FloatArray, mask: BoolArray, count: int) -> IntArray:
    """The ``count`` feasible nodes with the smallest key, given the key with +inf on refused nodes.

    :param keyed: the sort key on feasible nodes, +inf on the others.
    :param mask: which nodes are feasible.
    :param count: how many nodes the request needs.
    :returns: up to ``count`` node indices, best first (fewer when fewer are feasible).
    """
    if count == 1:
        # argmin returns the first of equal minima: the same tie-break as a stable sort.
        best = int(keyed.argmin())
        return np.array([best] if mask[best] else [], dtype=np.int64)
    candidates = np.flatnonzero(mask)
    order = np.argsort(keyed[candidates], kind="stable")
    return candidates[order[:count]].astype(np.int64)


def first_k_by_key(key: FloatArray, mask: BoolArray, count: int) -> IntArray:
    """The ``count`` feasible nodes with the smallest key; ties go to the earlier node.

    :param key: one sort key per node (smaller is tried first).
    :param mask: which nodes are feasible.
    :param count: how many nodes the request needs.
    :returns: up to ``count`` node indices, best first (fewer when fewer are feasible).
    """
    return first_k_keyed(np.where(mask, key, np.inf), mask, count)


def dimension_reason(req: Request, used: Sequence[float], capacity: Sequence[float], threshold: float,
                     mode: str) -> str | None:
    """The first dimension that would exceed its limit (:func:`limit_factors`) after placement.

    :param req: the request.
    :param used: the node's reservations, in :data:`~coordinator.domain.DIMENSIONS` order.
    :param capacity: the node's capacity, in the same order.
    :param threshold: the policy's threshold.
    :param mode: the threshold mode.
    :returns: a short reason, or None when every dimension stays under its limit.
    """
    factors = limit_factors(threshold, mode, is_shared(req))
    for name, d, u, c, f in zip(DIMENSIONS, req.demand.as_tuple(), used, capacity, factors, strict=True):
        # The same expression as the vectorised filter (limit = factor × capacity), so both round identically.
        if not u + d <= f * c:
            if f < 1.0:
                return f"{name} over threshold {threshold:g}"
            return f"{name} over capacity"
    return None


def gpu_fit_reason(req: Request, mem_free: Sequence[float], share_free: Sequence[float]) -> str | None:
    """Why a node's GPUs cannot hold the request (whole free GPUs, or a share), None when they can.

    :param req: the request.
    :param mem_free: free memory of each of the node's GPUs, in bytes.
    :param share_free: free compute share of each of the node's GPUs, 0..1.
    :returns: a short reason or None.
    """
    per_gpu = req.gpu_mem_per_gpu_bytes
    whole = req.whole_gpus
    if whole > 0:
        free = sum(1 for m, s in zip(mem_free, share_free, strict=True) if s >= 1.0 and m >= per_gpu)
        if free < whole:
            return f"{free} free GPUs with ≥ {per_gpu / _GIB:.0f} GiB, needs {whole}"
        return None
    share = req.demand.gpus
    if share > 0 and not any(s >= share and m >= per_gpu for m, s in zip(mem_free, share_free, strict=True)):
        return f"no GPU with share {share:g} and {per_gpu / _GIB:.0f} GiB free"
    return None


def constraint_reason(req: Request, node: NodeSnapshot) -> str | None:
    """Why the node does not satisfy the request's constraints, None when it does.

    :param req: the request (GPU model substring, node selector).
    :param node: the node.
    :returns: a short reason or None.
    """
    if not node.schedulable:
        return "not schedulable"
    if req.gpu_model and req.gpu_model.lower() not in node.gpu_model.lower():
        return f"gpu model {node.gpu_model!r} does not match {req.gpu_model!r}"
    if node.node_id in req.avoid_nodes:
        return "excluded: --exclude names it, or another replica of its service runs there"
    if req.only_nodes and node.node_id not in req.only_nodes:
        return "not in its node list"
    for key, value in req.node_selector.items():
        if node.labels.get(key) != value:
            return f"label {key}={value} missing"
    return None


def feasible(req: Request, node: NodeSnapshot, threshold: float, mode: str = DEFAULT_THRESHOLD_MODE) -> str | None:
    """The filter shared by every policy: constraints, then every dimension ≤ its limit, then GPUs.

    Constraints come first because they are the cheapest and the most decisive; the GPU check
    comes last because only nodes with enough aggregate room can have the right free GPUs.

    :param req: the request.
    :param node: the node, as in this cycle's snapshot.
    :param threshold: the cap on the capped dimensions' utilization after placement.
    :param mode: which dimensions the threshold caps (:data:`THRESHOLD_MODES`).
    :returns: a short reason the node is refused, or None when it is feasible.
    """
    return (
        constraint_reason(req, node)
        or dimension_reason(req, node.used.as_tuple(), node.capacity.as_tuple(), threshold, mode)
        or gpu_fit_reason(req, [g.mem_free_bytes for g in node.gpus], [g.share_free for g in node.gpus])
    )


class ThresholdPolicy:
    """What every policy shares: the threshold filter of :func:`feasible`, and no memory of commits.

    Subclasses set ``name``, ``sorts_requests`` and ``scale_out`` and define ``rank`` and
    ``select``; a stateful one (round-robin's cursor) overrides :meth:`committed`.

    :param args: validated arguments.
    """

    ranked_by_key = False
    confirms_lazily = False
    reads_view = True
    varies_key = False

    def __init__(self, args: PolicyArgs) -> None:
        self.args = args
        self.threshold = args.threshold
        self.threshold_mode = args.threshold_mode

    def feasible(self, req: Request, node: NodeSnapshot) -> str | None:
        """Filter: see :func:`feasible`."""
        return feasible(req, node, self.threshold, self.threshold_mode)

    def select(self, view: NodeArrays, mask: BoolArray, req: Request) -> IntArray:
        """Indices of up to ``req.nodes`` feasible nodes, in choice order (every subclass defines it)."""
        raise NotImplementedError

    def committed(self, indices: IntArray, n_nodes: int) -> None:
        """Stateless: nothing to remember."""

    def rank_key(self) -> RankKey | None:
        """No per-node key to keep."""
        return None

    def shape_variant(self, req: Request) -> object:
        """The key depends on the shape alone."""
        return None

    def select_indexed(self, view: NodeArrays, entry: ShapeIndex, req: Request) -> IntArray:
        """``select`` on the entry's mask (policies whose choice the block index speeds up override this)."""
        return self.select(view, entry.mask, req)

    def select_one(self, view: NodeArrays, entry: ShapeIndex, req: Request) -> int:
        """:meth:`select_indexed`'s node for a one-node request, -1 when it chooses none (policies that
        find it without an array override this)."""
        chosen = self.select_indexed(view, entry, req)
        return int(chosen[0]) if len(chosen) else -1

    def committed_one(self, i: int, n_nodes: int) -> None:
        """:meth:`committed` with the one node ``i`` (nothing to do unless a subclass keeps state)."""
        if type(self).committed is not ThresholdPolicy.committed:
            self.committed(np.array([i], dtype=np.int64), n_nodes)


class KeyedPolicy(ThresholdPolicy, ABC):
    """A policy that tries nodes by ascending per-node key, ties in snapshot order (Alg. 1-3).

    An abstract base: a subclass states its key once, in :meth:`key`, as arithmetic over the node
    fields; the vectorised form (:meth:`key_array`), the one-node form the shape cache updates
    with (:meth:`key_at`), ``select`` and ``rank`` all follow from it.

    :param args: validated arguments.
    """

    ranked_by_key = True

    @abstractmethod
    def key(self, nodes: NodeFields, req: Request) -> FloatArray | float:
        """The sort key, smaller first: an array on :class:`NodeArrays`, a float on a :class:`NodeRow`.

        Write it with ``+ - * /`` and unary minus on the fields only (no numpy function, no
        branch on a value), so that both forms round alike.
        """

    def key_array(self, view: NodeArrays, req: Request) -> FloatArray:
        """Per-node sort key: :meth:`key` on every node at once."""
        # On arrays the key's arithmetic yields an array (the key is written over fields only).
        return cast(FloatArray, self.key(view, req))

    def key_at(self, view: NodeArrays, req: Request, i: int) -> float:
        """``key_array(view, req)[i]``: :meth:`key` on node ``i`` alone, with the same rounding."""
        return float(self.key(NodeRow(view, i), req))   # on one row the same arithmetic yields a float

    def rank(self, req: Request, nodes: Sequence[NodeSnapshot]) -> list[NodeId]:
        """Node ids by ascending :meth:`key`, ties in snapshot order."""
        order = np.argsort(self.key_array(node_arrays(nodes), req), kind="stable")
        return [nodes[i].node_id for i in order.tolist()]

    def select(self, view: NodeArrays, mask: BoolArray, req: Request) -> IntArray:
        """The ``req.nodes`` feasible nodes with the smallest key."""
        return first_k_by_key(self.key_array(view, req), mask, req.nodes)

    def rank_key(self) -> KeyedPolicy:
        """Its own key."""
        return self

    def select_indexed(self, view: NodeArrays, entry: ShapeIndex, req: Request) -> IntArray:
        """The entry's ``req.nodes`` best nodes by the key it keeps (this policy's)."""
        return select_best(entry, req.nodes)

    def select_one(self, view: NodeArrays, entry: ShapeIndex, req: Request) -> int:
        """The entry's best node by the key it keeps (-1: none)."""
        return entry.best()


def select_best(entry: ShapeIndex, count: int) -> IntArray:
    """Up to ``count`` feasible nodes of a shape entry by ascending kept key (ties: earlier node).

    :param entry: the shape cache's entry (its ``keyed`` is not None).
    :param count: how many nodes the request needs.
    :returns: node indices, best first.
    """
    if count == 1:
        best = entry.best()
        return np.array([best] if best >= 0 else [], dtype=np.int64)
    return entry.first_k(count)
