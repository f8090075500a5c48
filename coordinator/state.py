"""The leader's in-memory state, owned in one place: tasks, what each node holds, services and queues.

Everything here follows etcd. A change is *proposed* by a component (the scheduler commits a
placement, the task table a state change, the service controller a scale) as a fenced etcd
transaction; only what the transaction stored is *applied* here, through the ``apply_*`` methods.
Every other component reads through read-only views: :attr:`LeaderState.tasks` and
:attr:`LeaderState.services` are mapping proxies, and a node's held tasks and reservation are
:attr:`NodeEntry.task_ids <coordinator.monitor.nodes.NodeEntry.task_ids>` (a frozen set) and
:attr:`NodeEntry.reservation <coordinator.monitor.nodes.NodeEntry.reservation>`, read from this state's
:class:`NodeHoldings`.

Records handed out are never changed in place: a change replaces the record with a new message,
so a reader holding the old one keeps a consistent (older) value.

What a node holds is this state's own (:class:`NodeHoldings`): per node, the allocation each unfinished task
placed there holds, and their sum (the node's reservation,
:class:`~coordinator.allocator.reservations.NodeReservation`). It is derived from the tasks' stored
allocations (``allocations/<task>``) and nothing else: etcd keeps no per-node totals (see
:mod:`coordinator.sync._placements` for why a GPU is still never booked twice, also across a leader
change). It changes only in :meth:`LeaderState.apply_placement` (a placement etcd committed),
:meth:`LeaderState.apply_release` (a transition that deleted the allocation in the same transaction) and
:meth:`LeaderState.adopt` (a new leader's view read from etcd at one revision); the node table reads it
through :attr:`NodeRegistry.holdings <coordinator.monitor.nodes.NodeRegistry.holdings>` (its entries through the
table's one :class:`~coordinator.monitor.nodes.HoldingsSource`).
"""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from types import MappingProxyType

from common.pb.gptrm.v1 import types_pb2
from common.types import TERMINAL_STATES, TaskState
from coordinator.allocator.reservations import NodeReservation
from coordinator.domain import ended_at
from coordinator.monitor.nodes import NodeRegistry
from coordinator.queues import QueueConfig
from coordinator.sync import node_demand

__all__ = ["LeaderState", "NodeHoldings"]


class NodeHoldings:
    """Who holds what on which node: per node, each holding task's allocation there, and their sum.

    Read by anyone (it is the node table's :class:`~coordinator.monitor.nodes.HoldingsView`); changed only by
    the :class:`LeaderState` that owns it (:meth:`hold`, :meth:`let_go`, :meth:`clear`), when etcd stored the
    change.
    """

    def __init__(self) -> None:
        self._by_node: dict[str, dict[str, types_pb2.NodeAllocation]] = {}   # node → task → its allocation there
        self._sums: dict[str, NodeReservation] = {}
        self._ids: dict[str, frozenset[str]] = {}   # node → frozenset of _by_node's keys, built once per change
        self._by_task: dict[str, tuple[types_pb2.NodeAllocation, ...]] = {}   # task → what it holds, every node
        self._versions: dict[str, int] = {}   # node → the stamp of its last change (absent: never held anything)
        self._stamp = 0   # rises with every change, across clear(): a node's version is never reused

    # ---- reads (HoldingsView) ---------------------------------------------------------------------

    def tasks_on(self, node_id: str) -> frozenset[str]:
        """The tasks holding something on ``node_id``."""
        ids = self._ids.get(node_id)
        if ids is None:
            ids = self._ids[node_id] = frozenset(self._by_node.get(node_id, ()))
        return ids

    def count_on(self, node_id: str) -> int:
        """How many tasks hold something on ``node_id``."""
        return len(self._by_node.get(node_id, ()))

    def reservation_on(self, node_id: str) -> NodeReservation:
        """The sum of the allocations held on ``node_id``."""
        return self._sums.get(node_id) or NodeReservation()

    def held_on(self, node_id: str) -> list[tuple[Sequence[int], int, float]]:
        """What each allocation holds on ``node_id``: (GPU indices, memory per GPU, share per GPU)."""
        return [(na.gpu_indices, na.demand.gpu_mem_bytes, na.gpu_share)
                for na in self._by_node.get(node_id, {}).values()]

    def version_on(self, node_id: str) -> int:
        """Changes whenever what ``node_id`` holds changes (and only then): 0 if it never held anything."""
        return self._versions.get(node_id, 0)

    def _changed(self, node_id: str) -> None:
        self._ids.pop(node_id, None)
        self._stamp += 1
        self._versions[node_id] = self._stamp

    # ---- changes (the owning LeaderState's) -----------------------------------------------------------

    def hold(self, task_id: str, nodes: Iterable[types_pb2.NodeAllocation]) -> None:
        """``task_id`` holds ``nodes`` (its allocation's parts); a node it holds already keeps what it holds there
        (the same placement followed twice)."""
        for na in nodes:
            on_node = self._by_node.setdefault(na.node_id, {})
            if task_id in on_node:
                continue
            on_node[task_id] = na
            self._by_task[task_id] = (*self._by_task.get(task_id, ()), na)
            self._changed(na.node_id)
            # What etcd stored is followed as stored (no check: a GPU held twice would be shown, not hidden).
            self._sums[na.node_id] = self.reservation_on(na.node_id).add(
                na.node_id, node_demand(na.demand), na.gpu_indices, na.gpu_share, check=False)

    def let_go(self, task_id: str, node_ids: Iterable[str] | None = None) -> None:
        """``task_id`` holds nothing any more (on ``node_ids`` only, when given)."""
        only = None if node_ids is None else set(node_ids)
        kept: list[types_pb2.NodeAllocation] = []
        for na in self._by_task.pop(task_id, ()):
            if only is not None and na.node_id not in only:
                kept.append(na)
                continue
            on_node = self._by_node.get(na.node_id)
            if on_node is None or on_node.pop(task_id, None) is None:
                continue
            self._changed(na.node_id)
            if on_node:
                self._sums[na.node_id] = self.reservation_on(na.node_id).remove(node_demand(na.demand), na.gpu_indices)
            else:   # nothing left: exactly empty, whatever float residue the sums left
                del self._by_node[na.node_id]
                self._sums.pop(na.node_id, None)
        if kept:
            self._by_task[task_id] = tuple(kept)

    def clear(self) -> None:
        """Nothing is held anywhere (before a new leader's view is adopted)."""
        self._by_node.clear()
        self._sums.clear()
        self._ids.clear()
        self._by_task.clear()
        self._versions.clear()


class LeaderState:
    """The one owner of the leader's tasks, node holdings, services and queues.

    Example::

        state = LeaderState(registry)
        state.adopt(stored.tasks, stored.nodes, stored.allocations)   # a new leader's view
        state.apply_placement(result.stored[task.id])    # what a placement commit stored
        state.tasks[task.id].state                       # read-only view

    :param registry: the node table (connections and telemetry are its own; holdings are this state's).
    :param on_forget: called with a task id when a finished task is forgotten (per-task readings).
    """

    def __init__(self, registry: NodeRegistry, on_forget: Callable[[str], None] | None = None) -> None:
        self._registry = registry
        self._on_forget = on_forget
        self._holdings = NodeHoldings()
        registry.holdings = self._holdings   # the node table reads what nodes hold from here
        self.holdings: NodeHoldings = self._holdings
        """What each node holds (read it; it changes through this state's ``apply_*`` methods only)."""
        self._tasks: dict[str, types_pb2.Task] = {}
        self._live: dict[str, types_pb2.Task] = {}   # the unfinished tasks of _tasks, kept with it
        self._live_elastic: dict[str, types_pb2.Task] = {}   # the elastic ones of _live, kept with it
        self._pending: dict[str, types_pb2.Task] = {}   # the PENDING ones of _live, kept with it
        self._order: list[tuple[float, str]] = []   # (submit time, id) of every task in _tasks, sorted
        self._ended: list[tuple[float, str]] = []   # (end time, id) of every finished task in _tasks, sorted
        self._by_state: dict[int, int] = {}   # state → how many tasks of _tasks are in it, kept with it
        self._services: dict[str, types_pb2.Service] = {}
        self._released: dict[str, tuple[types_pb2.NodeAllocation, ...]] = {}
        self._arrays: dict[str, set[str]] = {}   # array id → its elements' task ids (the ones known)
        self.changes = 0
        """Rises with every stored change followed that concerns an unfinished task (its record, a placement, a
        release, an unfinished task forgotten) and with a view adopted; not with a reason noted in memory nor with a
        finished task changing again. Equal counts: the unfinished tasks and what they hold are the same."""
        self.queues = QueueConfig()
        """The team queues as etcd stored them (immutable; replaced by :meth:`apply_queues`)."""
        self.queues_revision = 0
        self.tasks: Mapping[str, types_pb2.Task] = MappingProxyType(self._tasks)
        """Every task by id: read-only and live."""
        self.live: Mapping[str, types_pb2.Task] = MappingProxyType(self._live)
        """The tasks not in a final state, by id: read-only and live. What the scheduler reads every cycle,
        so a cycle's cost follows the work in flight, not the finished tasks retained."""
        self.live_elastic: Mapping[str, types_pb2.Task] = MappingProxyType(self._live_elastic)
        """The unfinished elastic tasks, by id: read-only and live. What the elastic allocator walks every cycle,
        so that a cluster without elastic work pays nothing for it."""
        self.pending: Mapping[str, types_pb2.Task] = MappingProxyType(self._pending)
        """The PENDING tasks, by id: read-only and live. What the scheduler walks every cycle, so that the tasks
        running do not cost a cycle anything."""
        self.services: Mapping[str, types_pb2.Service] = MappingProxyType(self._services)
        """Every service by id: read-only and live."""
        self.node_writes = asyncio.Lock()
        """Held from copying a node record to applying what etcd stored, by every writer of node records
        (node states, cordon and drain, power states), so that none overwrites another's change."""

    # ---- a new leader's view ------------------------------------------------------------------------

    def adopt(self, tasks: Mapping[str, types_pb2.Task], nodes: Mapping[str, types_pb2.NodeRecord],
              allocations: Mapping[str, types_pb2.Allocation] | None = None) -> None:
        """Take over the view etcd holds at one revision: its tasks, its node records followed by the node table
        (admin state is etcd's; a node whose agent already streams to this replica keeps the inventory of that
        live stream), and what each node holds, derived from the stored allocations (``allocations/<task>``,
        by task id; None: those the unfinished tasks record, for a caller that read no allocations). A node
        record's own reservation fields (an older layout's) are not read."""
        self.changes += 1
        for rec in nodes.values():
            if self._registry.get(rec.inventory.node_id) is None:
                self._registry.load(rec)
            else:
                self._registry.follow_stored(rec)
        self._tasks.clear()
        self._tasks.update(tasks)
        self._live.clear()
        self._live.update((tid, t) for tid, t in tasks.items() if t.state not in TERMINAL_STATES)
        self._live_elastic.clear()
        self._live_elastic.update((tid, t) for tid, t in self._live.items() if t.spec.HasField("elastic"))
        self._pending.clear()
        self._pending.update((tid, t) for tid, t in self._live.items() if t.state == TaskState.PENDING)
        self._order = sorted((t.submit_unix_s, tid) for tid, t in tasks.items())
        self._ended = sorted((ended_at(t), tid) for tid, t in tasks.items() if t.state in TERMINAL_STATES)
        self._by_state = {}
        for t in tasks.values():
            self._by_state[t.state] = self._by_state.get(t.state, 0) + 1
        self._released.clear()
        self._arrays.clear()
        for task in tasks.values():
            self._index_array(task)
        self._holdings.clear()
        if allocations is None:
            allocations = {tid: t.allocation for tid, t in self._live.items() if t.allocation.nodes}
        for task_id, alloc in allocations.items():
            self._holdings.hold(task_id, alloc.nodes)

    def adopt_services(self, services: Mapping[str, types_pb2.Service]) -> None:
        """Take over the services etcd holds."""
        self._services.clear()
        self._services.update(services)

    # ---- tasks ------------------------------------------------------------------------------------

    def apply_task(self, stored: types_pb2.Task) -> None:
        """Follow a task record etcd stored (a submit, a state change, an update, a re-read). A task back in the
        queue no longer has its allocation: the one it gave up is kept (:meth:`released`)."""
        if stored.id in self._live or stored.state not in TERMINAL_STATES:
            self.changes += 1   # a finished task changing again (a re-read) changes nothing unfinished
        before = self._tasks.get(stored.id)
        if before is not None and before.allocation.nodes and not stored.allocation.nodes:
            self._released[stored.id] = tuple(before.allocation.nodes)
        self._put(stored)

    def _put(self, task: types_pb2.Task) -> None:
        before = self._tasks.get(task.id)
        if before is None or before.submit_unix_s != task.submit_unix_s:
            if before is not None:
                self._unorder(before)
            bisect.insort(self._order, (task.submit_unix_s, task.id))   # a new task sorts last: cheap
        if before is not None:
            self._count(before.state, -1)
        self._count(task.state, 1)
        if before is not None and before.state in TERMINAL_STATES:
            _unsort(self._ended, (ended_at(before), before.id))
        if task.state in TERMINAL_STATES:
            bisect.insort(self._ended, (ended_at(task), task.id))   # a task ending now sorts last: cheap
        self._tasks[task.id] = task
        if before is None:
            self._index_array(task)
        if task.state in TERMINAL_STATES:
            self._live.pop(task.id, None)
            self._live_elastic.pop(task.id, None)
        else:
            self._live[task.id] = task
            if task.spec.HasField("elastic"):
                self._live_elastic[task.id] = task
        if task.state == TaskState.PENDING:
            self._pending[task.id] = task
        else:
            self._pending.pop(task.id, None)

    def released(self, task_id: str) -> tuple[types_pb2.NodeAllocation, ...]:
        """The allocation ``task_id`` last gave up when it went back to the queue (a preemption, a resize, a
        restart, a drain), so that the time it held it is accounted to the GPUs that ran it; empty when this
        replica did not see it happen."""
        return self._released.get(task_id, ())

    def apply_placement(self, stored: types_pb2.Task) -> None:
        """Follow a placement etcd committed: the task as stored, and its allocation held on its nodes."""
        self.changes += 1
        self._put(stored)
        self._holdings.hold(stored.id, stored.allocation.nodes)

    def apply_release(self, task: types_pb2.Task) -> None:
        """``task``'s allocation was deleted in etcd (a transition with ``release``): it holds nothing now."""
        self.changes += 1
        self._holdings.let_go(task.id)

    def note_reason(self, task_id: str, reason: str) -> None:
        """Show why a task waits (in memory only: a pending reason is not worth an etcd write per cycle).

        The record is replaced, never changed in place."""
        task = self._tasks.get(task_id)
        if task is None or task.reason == reason:
            return
        noted = types_pb2.Task()
        noted.CopyFrom(task)
        noted.reason = reason
        self._put(noted)

    def forget(self, task_id: str) -> None:
        """Drop a finished task removed from etcd (retention), or one etcd no longer has."""
        if task_id in self._live:
            self.changes += 1
        self._released.pop(task_id, None)
        self._live.pop(task_id, None)
        self._live_elastic.pop(task_id, None)
        self._pending.pop(task_id, None)
        task = self._tasks.pop(task_id, None)
        if task is None:
            return
        self._count(task.state, -1)
        self._unorder(task)
        if task.state in TERMINAL_STATES:
            _unsort(self._ended, (ended_at(task), task.id))
        if task.array_id:
            elements = self._arrays.get(task.array_id)
            if elements is not None:
                elements.discard(task_id)
                if not elements:
                    del self._arrays[task.array_id]
        if self._on_forget is not None:
            self._on_forget(task_id)

    def _unorder(self, task: types_pb2.Task) -> None:
        _unsort(self._order, (task.submit_unix_s, task.id))

    # ---- arrays -----------------------------------------------------------------------------------

    def _index_array(self, task: types_pb2.Task) -> None:
        if task.array_id:
            self._arrays.setdefault(task.array_id, set()).add(task.id)

    def array_elements(self, array_id: str) -> list[types_pb2.Task]:
        """The elements of an array this replica knows, by index (empty: no such array)."""
        found = (self._tasks.get(i) for i in self._arrays.get(array_id, ()))
        return sorted((t for t in found if t is not None), key=lambda t: t.array_index)

    def has_array(self, array_id: str) -> bool:
        """Whether any element of ``array_id`` is known."""
        return bool(self._arrays.get(array_id))

    # ---- node holdings without a task record (the simulator's virtual-time placements) ---------------

    def hold(self, task_id: str, nodes: Iterable[types_pb2.NodeAllocation]) -> None:
        """Reserve ``nodes`` for ``task_id`` (a placement accepted without a stored task record)."""
        self._holdings.hold(task_id, nodes)

    def let_go(self, task_id: str, node_ids: Iterable[str] | None = None) -> None:
        """Undo :meth:`hold` (on ``node_ids`` only, when given)."""
        self._holdings.let_go(task_id, node_ids)

    # ---- services ---------------------------------------------------------------------------------

    def apply_service(self, stored: types_pb2.Service) -> None:
        """Follow a service record etcd stored."""
        self._services[stored.id] = stored

    # ---- queues -----------------------------------------------------------------------------------

    def apply_queues(self, config: QueueConfig, revision: int) -> None:
        """Follow the queue tree etcd stored at ``revision`` (0: none stored)."""
        self.queues, self.queues_revision = config, revision

    # ---- nodes' admin and power state ----------------------------------------------------------------

    def apply_node(self, stored: types_pb2.NodeRecord) -> None:
        """Follow a node record etcd stored (an admin, power or state change): everything but its inventory,
        which stays the live stream's (what the node holds is this state's, not the record's)."""
        self._registry.follow_stored(stored)

    # ---- reads -------------------------------------------------------------------------------------

    def in_submit_order(self, after: tuple | None = None) -> Iterator[types_pb2.Task]:
        """Every task in (submit time, id) order, from the first whose key is above ``after`` (None: from the
        start); a walk costs what it reads (a page of a listing), not the whole table.

        :raises TypeError: ``after`` does not compare with (float, str) keys.
        """
        order = self._order
        at = 0 if after is None else bisect.bisect_right(order, tuple(after))
        while at < len(order):
            task = self._tasks.get(order[at][1])
            at += 1
            if task is not None:
                yield task

    def ended_since(self, since: float) -> list[types_pb2.Task]:
        """The finished tasks that ended at or after ``since`` (:func:`~coordinator.domain.ended_at`), in end order:
        what a reader of recent ends walks instead of every retained task."""
        at = bisect.bisect_left(self._ended, (since, ""))
        return [self._tasks[tid] for _end, tid in self._ended[at:]]

    def ended_in_order(self) -> Iterator[types_pb2.Task]:
        """Every finished task, the one that ended first first, read lazily (retention stops at the first it keeps);
        walk it without awaiting in between."""
        for _end, tid in self._ended:
            task = self._tasks.get(tid)
            if task is not None:
                yield task

    @property
    def finished_count(self) -> int:
        """How many finished tasks are kept."""
        return len(self._ended)

    def unfinished(self) -> list[types_pb2.Task]:
        """Tasks not in a final state, as a list taken now."""
        return list(self._live.values())

    def counts(self) -> dict[str, int]:
        """Tasks by state label (kept as records change: a scrape or a status call walks no task)."""
        out: dict[str, int] = {}
        for state, n in self._by_state.items():
            label = TaskState(state).label if state else "unknown"
            out[label] = out.get(label, 0) + n
        return out

    def count_in(self, state: int) -> int:
        """How many tasks are in ``state`` now (kept as records change)."""
        return self._by_state.get(int(state), 0)

    def _count(self, state: int, delta: int) -> None:
        n = self._by_state.get(state, 0) + delta
        if n:
            self._by_state[state] = n
        else:
            del self._by_state[state]


def _unsort(keys: list[tuple[float, str]], key: tuple[float, str]) -> None:
    """Remove ``key`` from the sorted ``keys`` (nothing if absent)."""
    at = bisect.bisect_left(keys, key)
    if at < len(keys) and keys[at] == key:
        del keys[at]
