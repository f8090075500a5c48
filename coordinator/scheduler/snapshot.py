"""The cycle's snapshot: READY nodes with their reservations and per-GPU free memory and share.

Every policy of a cycle reads this one snapshot, taken once at its start, so that
what the policies compare is consistent even while agents keep streaming.

Task uids are a resource too: a node whose agent reports room for ``task_uid_room`` tasks with a uid
of their own (``agent/room.py``) and already holds that many placed tasks is unschedulable in the
snapshot, so placement goes elsewhere or the task waits, instead of a start refused with "no free task
uid". A node whose agent reports nothing (an older agent, or one that hands out no uids) has no limit.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from common.oci import CONTAINERS_LABEL
from common.pb.gptrm.v1 import types_pb2
from common.topology import NodeTopology, topology_from_gpus
from common.types import TERMINAL_STATES
from coordinator.allocator.reservations import gpu_usage
from coordinator.domain import ClusterSnapshot, GpuSlot, NodeSnapshot, PowerCurve, Request, Resources
from coordinator.monitor.nodes import NodeEntry, NodeRegistry
from coordinator.monitor.power_model import PowerModel
from coordinator.power_states import power_label
from coordinator.scheduler.policies.base import DEFAULT_THRESHOLD_MODE, feasible
from coordinator.scheduler.queue import request_for

_NO_IMAGES: frozenset[str] = frozenset()

__all__ = ["NodeFit", "SnapshotBuilder", "takes_uid"]

_Holdings = dict[str, list[tuple[Sequence[int], int, float]]]
"""Node id → what each live allocation holds there: (GPU indices, memory per GPU, share per GPU)."""


def _holdings(tasks: Iterable[types_pb2.Task]) -> _Holdings:
    holdings: _Holdings = {}
    for task in tasks:
        if task.state in TERMINAL_STATES or not task.allocation.nodes:
            continue
        for na in task.allocation.nodes:
            holdings.setdefault(na.node_id, []).append((na.gpu_indices, na.demand.gpu_mem_bytes, na.gpu_share))
    return holdings


def takes_uid(task: types_pb2.Task) -> bool:
    """Whether a task's parts each take a task uid of their agent's own (a spec naming a user runs as it)."""
    return not task.spec.run_as_user


class NodeFit:
    """Whether one node could take a task's one-node share now, by the placement filter itself
    (:func:`~coordinator.scheduler.policies.base.feasible`: constraints, every dimension at or under its
    limit after placement, free GPUs with the memory and share asked for), whatever the node's power
    state or schedulability: the question the Resource Adaptor asks before it keeps an idle node on or
    wakes an off one.

    ``fit(task)`` is a predicate over nodes; tasks of one request shape share one predicate (the same
    object), whose answers are kept per node, so many pending tasks of a few shapes cost a few filter
    runs. The leader builds one per step; a caller that keeps one (the simulator) calls :meth:`forget`
    for every node whose holdings changed.

    :param node: the node as placement would see it, schedulable (an off node holding nothing).
    :param request: a task's placement request.
    :param threshold: the policy's threshold.
    :param mode: the policy's threshold mode.
    """

    def __init__(self, node: Callable[[NodeEntry], NodeSnapshot], request: Callable[[types_pb2.Task], Request],
                 threshold: float, mode: str = DEFAULT_THRESHOLD_MODE) -> None:
        self._node, self._request, self._threshold, self._mode = node, request, threshold, mode
        self._views: dict[str, NodeSnapshot] = {}
        self._by_shape: dict[tuple[object, ...], tuple[Callable[[NodeEntry], bool], dict[str, bool]]] = {}

    def forget(self, node_id: str) -> None:
        """The node's holdings changed: build its view and answers again at the next question."""
        self._views.pop(node_id, None)
        for _, answers in self._by_shape.values():
            answers.pop(node_id, None)

    def __call__(self, task: types_pb2.Task) -> Callable[[NodeEntry], bool]:
        req = self._request(task)
        shape = req.shape
        known = self._by_shape.get(shape)
        if known is not None:
            return known[0]
        answers: dict[str, bool] = {}

        def fits(entry: NodeEntry) -> bool:
            answer = answers.get(entry.node_id)
            if answer is None:
                view = self._views.get(entry.node_id)
                if view is None:
                    view = self._views[entry.node_id] = self._node(entry)
                answer = answers[entry.node_id] = feasible(req, view, self._threshold, self._mode) is None
            return answer

        self._by_shape[shape] = (fits, answers)
        return fits


@dataclass(frozen=True, slots=True)
class _NodeStatic:
    """What a node's snapshot takes from its inventory.

    :param check: (stream id, GPU count, cores, memory, disk): the inventory it was built from.
    :param capacity: the node's capacity vector.
    :param slots: ``(index, memory, topology group)`` per GPU (-1: topology unknown).
    :param free: every GPU as a fully free slot.
    :param model: the first GPU's model ("" without GPUs).
    :param gpu_mem_per_gpu_bytes: one GPU's memory (for the datasheet power guess of unknown models).
    :param labels: the node's labels (shared by snapshots; never modified).
    :param topology: the GPUs' links and NUMA placement (None when the agent reported none).
    """

    check: tuple[int, int, int, int, int]
    capacity: Resources
    slots: tuple[tuple[int, int, int], ...]
    free: tuple[GpuSlot, ...]
    model: str
    gpu_mem_per_gpu_bytes: int
    labels: dict[str, str]
    topology: NodeTopology | None = None


class SnapshotBuilder:
    """Builds the cycle's :class:`~coordinator.domain.ClusterSnapshot` from the leader's tables.

    What a node's snapshot takes from its inventory (capacity, GPU slots, model, labels) is built
    once per agent stream and reused; an idle node's all-free GPU tuple is reused too, so a cycle
    only builds what reservations change.

    :param power: the power model whose curves Alg. 3 ranks by.
    """

    def __init__(self, power: PowerModel) -> None:
        self._power = power
        self._statics: dict[str, _NodeStatic] = {}
        self._views: dict[str, tuple[tuple[object, ...], NodeSnapshot]] = {}
        self._empty: dict[str, tuple[_NodeStatic, tuple[str, ...], NodeSnapshot]] = {}
        self.uid_room: dict[str, int] = {}
        """After :meth:`snapshot`: per node whose agent reports its task uids, how many more tasks it can take
        (≤ 0: none, and the node is unschedulable in that snapshot)."""

    def snapshot(self, tasks: Iterable[types_pb2.Task], registry: NodeRegistry, *,
                 stored: bool = False) -> ClusterSnapshot:
        """Schedulable nodes in node-id order, with what live allocations hold on each GPU.

        A node whose inputs (inventory, recorded reservation, what allocations hold on it, power
        curve) are those of the last snapshot is the same object as in the last snapshot, so the
        kept placement state (:class:`~coordinator.scheduler.placement.live.LivePlacement`) sees at
        once which nodes changed.

        :param tasks: the unfinished tasks (with ``stored``, only to count the task uids a full node frees).
        :param stored: what each node holds is what etcd stored (the node table's holdings, derived from the
            stored allocations: the scheduling cycle's view) instead of what ``tasks`` allocate (a hypothetical
            set: preemption's "what if these ended"). A node whose holdings did not change since the last
            snapshot then costs no walk over its allocations.
        """
        tasks = tasks if isinstance(tasks, list) else list(tasks)
        holdings = None if stored else _holdings(tasks)
        schedulable = registry.schedulable
        views: dict[str, tuple[tuple[object, ...], NodeSnapshot]] = {}
        room: dict[str, int] = {}
        named: set[str] | None = None
        nodes = []
        for e in sorted(registry, key=lambda e: e.node_id):
            free = True
            if e.task_uid_room is not None:
                left = e.task_uid_room - e.held_count   # every task placed there, counted at once
                if left <= 0:   # exactly: a task running as a named user takes no uid of the range
                    if named is None:
                        named = {t.id for t in tasks if not takes_uid(t)}
                    left = e.task_uid_room - len(e.task_ids - named)
                room[e.node_id] = left
                free = left > 0
            if not schedulable(e):
                continue
            if holdings is None:   # the stored holdings: their version stands for them until a view is built
                nodes.append(self._kept_view(e, ("stored", e.holdings_version), None, views, free))
            else:
                held = holdings.get(e.node_id, [])
                nodes.append(self._kept_view(e, tuple((tuple(g), m, s) for g, m, s in held), held, views, free))
        self._views = views   # nodes no longer in the snapshot are forgotten
        self.uid_room = room
        return ClusterSnapshot(nodes=tuple(nodes), taken_at_s=time.time())

    def _kept_view(self, e: NodeEntry, what: object, held: list[tuple[Sequence[int], int, float]] | None,
                   views: dict[str, tuple[tuple[object, ...], NodeSnapshot]], uid_free: bool = True) -> NodeSnapshot:
        """:meth:`_view`, or the last snapshot's object for the node when none of its inputs changed: ``what`` stands
        for what the node holds in that comparison, ``held`` is it (None: the stored holdings, read from the node's
        entry only when a view is built)."""
        r = e.reservation.used
        key = (self._static_part(e), r.gpus, r.gpu_mem_total_bytes, r.cpu_cores, r.mem_bytes, r.disk_bytes,
               what, self.power_curve(e)[0], uid_free,
               tuple([f.gpu_index for f in e.record.gpu_fences]), e.degraded_gpus, tuple(e.inventory.images))
        last = self._views.get(e.node_id)
        view = last[1] if last is not None and last[0] == key else \
            self._view(e, (e.held if held is None else held) or None, schedulable=uid_free)
        views[e.node_id] = (key, view)
        return view

    def fit(self, tasks: Iterable[types_pb2.Task], threshold: float, mode: str = DEFAULT_THRESHOLD_MODE) -> NodeFit:
        """A :class:`NodeFit` over the leader's tables now: a node as this cycle's snapshot would show it
        if it were schedulable; an off node holds nothing.

        :param tasks: every task (live allocations are what nodes hold).
        :param threshold: the policy's threshold now.
        :param mode: the policy's threshold mode now.
        """
        holdings = _holdings(tasks)

        def node(entry: NodeEntry) -> NodeSnapshot:
            off = power_label(entry.record.power_state) == "off"
            return self._view(entry, None if off else holdings.get(entry.node_id), empty=off)

        return NodeFit(node, request_for, threshold, mode)

    def empty_nodes(self, registry: NodeRegistry) -> list[NodeSnapshot]:
        """Every known node (ready, off, cordoned, draining, lost) as placement would see it empty and schedulable,
        in node-id order: what could hold a task if everything on it ended and it came back.

        Asked at every submit (``PlaceabilityCheck``), so a node's view is kept until its inventory (a new stream)
        or images change; the power curve in it is the one of then (whether a node could ever hold a task does
        not depend on it).

        :param registry: the leader's node table.
        :returns: one snapshot per node.
        """
        out: list[NodeSnapshot] = []
        kept: dict[str, tuple[_NodeStatic, tuple[str, ...], NodeSnapshot]] = {}
        for e in sorted(registry, key=lambda e: e.node_id):
            static, images = self._static_part(e), tuple(e.inventory.images)
            last = self._empty.get(e.node_id)
            view = last[2] if last is not None and last[0] is static and last[1] == images \
                else self._view(e, None, empty=True)
            kept[e.node_id] = (static, images, view)
            out.append(view)
        self._empty = kept   # nodes gone are forgotten
        return out

    def _view(self, e: NodeEntry, held: list[tuple[Sequence[int], int, float]] | None, *,
              empty: bool = False, schedulable: bool = True) -> NodeSnapshot:
        """One node with what ``held`` holds on its GPUs and its recorded reservation (none if ``empty``), its
        fenced GPUs full and its DEGRADED ones marked (an ``empty`` node, what it could hold once repaired too,
        has neither)."""
        static = self._static_part(e)
        fenced = () if empty else [f.gpu_index for f in e.record.gpu_fences]
        degraded = frozenset() if empty else e.degraded_gpus
        if held is None and not fenced and not degraded:
            gpus = static.free
        else:
            # A fenced GPU (coordinator/health) is offered with nothing free, so no request fits it; a DEGRADED
            # one is marked for the allocator to take last.
            taken = gpu_usage(held or [])
            gpus = tuple(GpuSlot(i, total, 0, 0.0, group, i in degraded) if i in fenced else
                         GpuSlot(i, total, max(0, total - taken.get(i, (0, 0.0))[0]),
                                 max(0.0, 1.0 - taken.get(i, (0, 0.0))[1]), group, i in degraded)
                         for i, total, group in static.slots)
        return NodeSnapshot(
            node_id=e.node_id, capacity=static.capacity, used=Resources() if empty else e.reservation.used,
            gpus=gpus, gpu_model=static.model, labels=static.labels, schedulable=schedulable,
            power=self.power_curve(e)[0], topology=static.topology,
            images=frozenset(e.inventory.images) if e.inventory.images else _NO_IMAGES)

    def power_curve(self, entry: NodeEntry) -> tuple[PowerCurve, str, int]:
        """The node's GPU power curve as Alg. 3 sees it, with its source (see :meth:`PowerModel.explain`).

        :param entry: the node.
        :returns: ``(curve, "fitted" or "datasheet", samples in its fit window)``.
        """
        static = self._static_part(entry)
        return self._power.explain(entry.node_id, static.model, len(static.slots), static.gpu_mem_per_gpu_bytes)

    def _static_part(self, entry: NodeEntry) -> _NodeStatic:
        """The inventory-derived part of a node's snapshot, rebuilt when the agent re-registers."""
        inv = entry.inventory
        check = (entry.stream_id, len(inv.gpus), inv.cpu_cores, inv.mem_total_bytes, inv.disk_total_bytes)
        cached = self._statics.get(entry.node_id)
        if cached is not None and cached.check == check:
            return cached
        slots = tuple((g.index, g.mem_total_bytes, g.topology_group) for g in inv.gpus)
        static = _NodeStatic(
            check=check,
            capacity=Resources(gpus=float(len(slots)), gpu_mem_total_bytes=sum(total for _, total, _ in slots),
                               cpu_cores=float(inv.cpu_cores), mem_bytes=inv.mem_total_bytes,
                               disk_bytes=inv.disk_total_bytes),
            slots=slots,
            free=tuple(GpuSlot(i, total, total, 1.0, group) for i, total, group in slots),
            model=inv.gpus[0].model if inv.gpus else "",
            gpu_mem_per_gpu_bytes=slots[0][1] if slots else 0,
            labels={**inv.labels, **({CONTAINERS_LABEL: "true"} if inv.containers else {})},
            topology=topology_from_gpus(inv.gpus),
        )
        self._statics[entry.node_id] = static
        return static
