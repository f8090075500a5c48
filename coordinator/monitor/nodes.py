"""Node registry: who is connected, their inventory, and their state.

States (derived by :class:`NodeRegistry` from the node's stream and record, never assigned elsewhere; an
admin sets cordon and drain in the record):

- READY: a stream is open and heartbeats arrive;
- NOT_READY: nothing heard for 3 liveness intervals (or the stream dropped, within the grace). The
  liveness interval is the longer of the heartbeat interval and the telemetry report interval in
  force (:meth:`NodeRegistry.set_report_interval`): an agent reporting a summary every 10 s sends
  nothing in between, and stays READY;
- LOST: no stream for ``lost_grace_s``;
- CORDONED / DRAINING: an admin's choice, shown while the node is otherwise healthy.

A node the Resource Adaptor powered off (or is switching, ``NodeRecord.power_state``) is never
LOST: its missing stream is expected; it stays NOT_READY and is not schedulable.

Health wins over admin state in what is shown, because an operator looking at a LOST node
needs to know it is lost more than that it was cordoned.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeAlias

from common.pb.gptrm.v1 import agent_pb2, types_pb2
from common.pbenum import pb_enum
from common.types import NodeState
from coordinator.allocator.reservations import NodeReservation
from coordinator.power_states import power_label

StreamQueue: TypeAlias = asyncio.Queue[agent_pb2.CoordinatorMessage | None]
"""What a connected node's stream sends: messages, then None to end the stream (on the gateway's
streams an :class:`Outbox`, which bounds it)."""
OUTBOX_LIMIT = 1024
"""Messages a stream's outbox holds for its agent before the stream is ended (the agent stopped reading)."""


class Outbox(asyncio.Queue[agent_pb2.CoordinatorMessage | None]):
    """A connected node's stream queue: messages to send, then None to end the stream.

    Bounded: once ``limit`` messages wait (an agent that stopped reading, or a stream gRPC cannot
    drain), the next one is not queued; None is, so the stream ends after what it holds, and
    everything later is dropped. The agent reconnects, and what it missed is made good: unseen
    starts are re-sent by the reconciler (an agent acts on a decision id at most once), the agent
    re-sends the events not acknowledged, and the log readers of that stream end with Unavailable.

    :param limit: messages held at most, None aside.
    """

    def __init__(self, limit: int = OUTBOX_LIMIT) -> None:
        super().__init__()
        self.limit = limit
        self.overflowed = False

    def put_nowait(self, item: agent_pb2.CoordinatorMessage | None) -> None:
        if item is not None:
            if self.overflowed:
                return
            if self.qsize() >= self.limit:
                self.overflowed = True
                item = None
        super().put_nowait(item)


__all__ = [
    "OUTBOX_LIMIT", "HoldingsSource", "HoldingsView", "NodeEntry", "NodeRegistry", "Outbox", "StreamQueue",
    "admin_state", "stored_state",
]

_MISSED_HEARTBEATS = 3
_POWER_ON = (types_pb2.NODE_POWER_STATE_UNSPECIFIED, types_pb2.NODE_POWER_STATE_READY)


def admin_state(record: types_pb2.NodeRecord) -> NodeState:
    """A healthy node's state: DRAINING by its record's admin flag or its health drain (the node itself at
    fault, ``coordinator/health``), CORDONED by its admin flag, else READY."""
    if record.draining or record.health_drained:
        return NodeState.DRAINING
    if record.cordoned:
        return NodeState.CORDONED
    return NodeState.READY


def stored_state(record: types_pb2.NodeRecord) -> NodeState:
    """A node's state as a replica that does not lead shows it from the stored record: the health the leader
    last stored (NOT_READY and LOST win, as on the leader; none stored reads NOT_READY), else the admin
    flags as stored (a cordon stored after the health was is still shown)."""
    if record.state in (0, NodeState.NOT_READY, NodeState.LOST):
        return NodeState(record.state or NodeState.NOT_READY)
    return admin_state(record)


class HoldingsView(Protocol):
    """What each node holds, read-only: kept by :class:`coordinator.state.LeaderState`, read by the node table."""

    def tasks_on(self, node_id: str) -> frozenset[str]:
        """The unfinished tasks placed on the node."""
        ...

    def count_on(self, node_id: str) -> int:
        """How many unfinished tasks are placed on the node."""
        ...

    def reservation_on(self, node_id: str) -> NodeReservation:
        """The sum of the allocations placed on the node (its GPUs as a sorted multiset)."""
        ...

    def held_on(self, node_id: str) -> list[tuple[Sequence[int], int, float]]:
        """What each allocation placed on the node holds there: (GPU indices, memory per GPU, share per GPU)."""
        ...

    def version_on(self, node_id: str) -> int:
        """Changes whenever what the node holds changes, and only then (0: it never held anything)."""
        ...


class _NoHoldings:
    """A node table no leader state follows yet: nothing is held anywhere."""

    def tasks_on(self, node_id: str) -> frozenset[str]:
        return frozenset()

    def count_on(self, node_id: str) -> int:
        return 0

    def reservation_on(self, node_id: str) -> NodeReservation:
        return NodeReservation()

    def held_on(self, node_id: str) -> list[tuple[Sequence[int], int, float]]:
        return []

    def version_on(self, node_id: str) -> int:
        return 0


@dataclass
class HoldingsSource:
    """Where a node table's entries read what their nodes hold: one per table, shared by its entries, pointed
    at the leader state's holdings when that state is made (:attr:`NodeRegistry.holdings`)."""

    view: HoldingsView = field(default_factory=_NoHoldings)


@dataclass
class NodeEntry:
    """What the coordinator knows about one node."""

    node_id: str
    record: types_pb2.NodeRecord
    slot: int
    connected: bool = False
    stream_id: int = 0
    last_heartbeat: float = 0.0          # monotonic
    disconnected_at: float = 0.0         # monotonic
    last_seen_unix_s: float = 0.0
    state: NodeState = NodeState.NOT_READY   # derived by NodeRegistry only (see the module docstring)
    dropped_samples_total: int = 0
    outbox: StreamQueue | None = None         # the stream's decision queue while connected
    # Room its agent last reported (TelemetrySample.task_uid_room, task_ports_free); None: unknown, no limit.
    task_uid_room: int | None = None
    task_ports_free: int | None = None
    ports_refused: dict[int, float] = field(default_factory=dict)   # master port → when a start found it taken
    # Health its agent reports now (coordinator/health sets them): GPUs DEGRADED (ranked last by placement),
    # and whether its site health check has no verdict yet (nothing new is placed here meanwhile).
    degraded_gpus: frozenset[int] = frozenset()
    health_pending: bool = False
    holdings_source: HoldingsSource = field(default_factory=HoldingsSource, repr=False)   # its table's

    @property
    def inventory(self) -> types_pb2.NodeInventory:
        return self.record.inventory

    @property
    def task_ids(self) -> frozenset[str]:
        """The unfinished tasks placed on this node (kept by :class:`coordinator.state.LeaderState`)."""
        return self.holdings_source.view.tasks_on(self.node_id)

    @property
    def held_count(self) -> int:
        """How many unfinished tasks are placed on this node (without copying :attr:`task_ids`)."""
        return self.holdings_source.view.count_on(self.node_id)

    @property
    def holds_tasks(self) -> bool:
        """Whether any unfinished task is placed on this node."""
        return self.holdings_source.view.count_on(self.node_id) > 0

    @property
    def reservation(self) -> NodeReservation:
        """What the allocations placed on this node hold (kept by :class:`coordinator.state.LeaderState`,
        derived from the tasks' allocations; etcd's node record has no totals)."""
        return self.holdings_source.view.reservation_on(self.node_id)

    @property
    def held(self) -> list[tuple[Sequence[int], int, float]]:
        """What each allocation placed on this node holds here: (GPU indices, memory per GPU, share per GPU)."""
        return self.holdings_source.view.held_on(self.node_id)

    @property
    def holdings_version(self) -> int:
        """Changes whenever what this node holds changes, and only then."""
        return self.holdings_source.view.version_on(self.node_id)

    @property
    def reserved(self) -> types_pb2.ResourceVector:
        """:attr:`reservation` as the API's vector (GPU memory as the total of the GPUs held)."""
        u = self.reservation.used
        return types_pb2.ResourceVector(gpus=u.gpus, gpu_mem_bytes=u.gpu_mem_total_bytes, cpu_cores=u.cpu_cores,
                                        mem_bytes=u.mem_bytes, disk_bytes=u.disk_bytes)

    def stored_view(self) -> types_pb2.NodeRecord:
        """The node's record with its reservation filled in, as the API shows it (a copy)."""
        record = types_pb2.NodeRecord()
        record.CopyFrom(self.record)
        record.reserved.CopyFrom(self.reserved)
        record.ClearField("reserved_gpu_indices")
        record.reserved_gpu_indices.extend(self.reservation.gpu_indices)
        return record


class NodeRegistry:
    """In-memory node table; the leader persists records to etcd (nodes/<id>) on change.

    :param heartbeat_interval_s: agents' heartbeat period.
    :param lost_grace_s: how long a node may be without a stream before it is LOST.
    :param now: monotonic clock (injected in tests).
    """

    def __init__(self, heartbeat_interval_s: float, lost_grace_s: float,
                 now: Callable[[], float] = time.monotonic) -> None:
        self.heartbeat_interval_s = heartbeat_interval_s
        self.lost_grace_s = lost_grace_s
        self.report_interval_s = 0.0     # the telemetry report interval in force (0: every sample)
        self._previous_report_s = 0.0    # a longer interval just left, honoured until _previous_until
        self._previous_until = 0.0
        self._now = now
        self._nodes: dict[str, NodeEntry] = {}
        self._source = HoldingsSource()
        self._next_slot = 0
        self._next_stream = 0
        self.connects_total = 0   # registrations (new streams) since start: the telemetry rate counts their cost
        self.generation = 0
        """Bumped by every change to the table that could change how placement sees a node: a node added or
        removed, its record (inventory, labels, images, admin and power state, fences) replaced, its state
        re-derived to another, its health. Equal generations: the same nodes as placement would judge them, so
        a reader of views derived from the table (the admission check) need not rebuild them."""

    @property
    def holdings(self) -> HoldingsView:
        """What each node holds, read through each entry (:attr:`NodeEntry.task_ids`, :attr:`NodeEntry.reservation`):
        the leader state's (:class:`coordinator.state.LeaderState` sets it when it is made); nothing before."""
        return self._source.view

    @holdings.setter
    def holdings(self, holdings: HoldingsView) -> None:
        self._source.view = holdings

    def __iter__(self) -> Iterator[NodeEntry]:
        return iter(list(self._nodes.values()))

    def __len__(self) -> int:
        return len(self._nodes)

    def get(self, node_id: str) -> NodeEntry | None:
        return self._nodes.get(node_id)

    def remove(self, node_id: str) -> NodeEntry | None:
        """Forget a node (removed by an admin or collected after being lost long); returns its entry."""
        self.generation += 1
        return self._nodes.pop(node_id, None)

    def set_images(self, entry: NodeEntry, refs: Iterable[str]) -> None:
        """The images the node's store holds now (in its inventory, which placement matches images against)."""
        del entry.inventory.images[:]
        entry.inventory.images.extend(refs)
        self.generation += 1

    def set_health(self, entry: NodeEntry, degraded_gpus: frozenset[int], pending: bool) -> None:
        """What the node's agent reports of its health now: its GPUs DEGRADED, whether its site check has no
        verdict yet."""
        if (degraded_gpus, pending) != (entry.degraded_gpus, entry.health_pending):
            entry.degraded_gpus, entry.health_pending = degraded_gpus, pending
            self.generation += 1

    def load(self, record: types_pb2.NodeRecord) -> NodeEntry:
        """Add a node known from etcd (after a leader change); it counts as disconnected from now."""
        entry = self._entry(record.inventory.node_id, record)
        entry.disconnected_at = self._now()
        entry.last_seen_unix_s = record.last_seen_unix_s
        self._derive(entry)
        return entry

    def _entry(self, node_id: str, record: types_pb2.NodeRecord) -> NodeEntry:
        self.generation += 1   # a node added, or its record about to be replaced
        entry = self._nodes.get(node_id)
        if entry is None:
            entry = NodeEntry(node_id, record, self._next_slot, holdings_source=self._source)
            self._next_slot += 1
            self._nodes[node_id] = entry
        return entry

    def connect(self, inventory: types_pb2.NodeInventory, outbox: StreamQueue) -> tuple[NodeEntry, bool]:
        """A node registered on a new stream; returns (entry, first time seen)."""
        node_id = inventory.node_id
        self.connects_total += 1
        is_new = node_id not in self._nodes
        old = self._nodes.get(node_id)
        record = types_pb2.NodeRecord()
        if old is not None:
            record.CopyFrom(old.record)
        record.inventory.CopyFrom(inventory)
        now_unix = time.time()
        if is_new or not record.registered_unix_s:
            record.registered_unix_s = now_unix
        record.last_seen_unix_s = now_unix
        entry = self._entry(node_id, record)
        entry.record = record
        self._next_stream += 1
        entry.stream_id = self._next_stream
        entry.connected = True
        entry.outbox = outbox
        entry.task_uid_room = entry.task_ports_free = None   # until this stream's agent reports them
        # A node whose agent runs a health check takes no work until that check's first verdict (its telemetry).
        entry.degraded_gpus, entry.health_pending = frozenset(), inventory.health_check
        entry.last_heartbeat = self._now()
        entry.last_seen_unix_s = now_unix
        # Stored with the registration: what a replica that does not lead shows (stored_state).
        record.state = pb_enum(types_pb2.NodeState, self._derive(entry))
        return entry, is_new

    def mark_connected(self, entry: NodeEntry) -> NodeState:
        """Count ``entry``'s agent as registered and heard from now, without a stream: for a registry whose nodes
        have no agents (the simulator's replay of the power manager, where a node's agent comes up when its
        simulated boot ends). Its state is derived as for a stream (READY unless its record cordons or drains
        it); :meth:`disconnect` with its ``stream_id`` takes it down again, as when a stream ends.

        :returns: its state now.
        """
        entry.connected = True
        entry.last_heartbeat = self._now()
        return self._derive(entry)

    def disconnect(self, node_id: str, stream_id: int) -> None:
        """The stream ``stream_id`` of ``node_id`` ended (a newer stream is left alone)."""
        entry = self._nodes.get(node_id)
        if entry is None or entry.stream_id != stream_id:
            return
        entry.connected = False
        entry.outbox = None
        entry.disconnected_at = self._now()
        self._derive(entry)

    def set_report_interval(self, interval_s: float) -> None:
        """The telemetry report interval changed. A longer one widens the liveness window at once (before an
        agent hears of it); after a shorter one the longer window still holds for three of its intervals,
        because an agent keeps its old interval until the push reaches it and its next summary is due."""
        if interval_s < self.report_interval_s:
            self._previous_report_s = self.report_interval_s
            self._previous_until = self._now() + _MISSED_HEARTBEATS * self.report_interval_s
        self.report_interval_s = interval_s

    @property
    def silence_limit_s(self) -> float:
        """Seconds a connected node may be silent before it is NOT_READY: 3 liveness intervals."""
        interval = max(self.heartbeat_interval_s, self.report_interval_s)
        if self._previous_report_s and self._now() < self._previous_until:
            interval = max(interval, self._previous_report_s)
        return _MISSED_HEARTBEATS * interval

    def stream_live(self, entry: NodeEntry) -> bool:
        """Whether the node's current stream is open and heard from within 3 liveness intervals."""
        return entry.connected and self._now() - entry.last_heartbeat <= self.silence_limit_s

    def lost_for(self, entry: NodeEntry) -> float:
        """Seconds the node has been LOST (0 when it is not)."""
        if entry.state != NodeState.LOST:
            return 0.0
        return max(0.0, self._now() - entry.disconnected_at - self.lost_grace_s)

    def heartbeat(self, entry: NodeEntry) -> None:
        """Anything received on the stream counts as a heartbeat."""
        entry.last_heartbeat = self._now()
        entry.last_seen_unix_s = time.time()

    def follow_stored(self, stored: types_pb2.NodeRecord) -> NodeEntry | None:
        """A known node's record as etcd stored it (an admin, power or state change, or a new leader's read)
        replaces the entry's, but for its inventory, which stays the live stream's; its state is re-derived.
        None: no such node here."""
        entry = self._nodes.get(stored.inventory.node_id)
        if entry is None:
            return None
        record = types_pb2.NodeRecord()
        record.CopyFrom(stored)
        record.inventory.CopyFrom(entry.record.inventory)
        entry.record = record
        self.generation += 1
        self._derive(entry)
        return entry

    def rederive(self, entry: NodeEntry) -> NodeState:
        """Re-derive one node's state at once (after its admin or power state changed)."""
        return self._derive(entry)

    def _derive(self, entry: NodeEntry, silence_s: float | None = None) -> NodeState:
        now = self._now()
        if silence_s is None:
            silence_s = self.silence_limit_s
        switched = entry.record.power_state not in _POWER_ON   # off or switching: a missing stream is expected
        if not entry.connected and now - entry.disconnected_at >= self.lost_grace_s and not switched:
            state = NodeState.LOST
        elif not entry.connected or now - entry.last_heartbeat > silence_s:
            state = NodeState.NOT_READY
        else:
            state = admin_state(entry.record)
        if state != entry.state:
            entry.state = state
            self.generation += 1
        return state

    def refresh(self) -> list[tuple[NodeEntry, NodeState]]:
        """Re-derive every node's state; returns the (entry, old state) pairs that changed."""
        changed = []
        silence_s = self.silence_limit_s
        for entry in self._nodes.values():
            old = entry.state
            if self._derive(entry, silence_s) != old:
                changed.append((entry, old))
        return changed

    def counts(self) -> dict[str, int]:
        """Nodes by state label; a node the Resource Adaptor powered off or is switching counts by its
        power state (``off``, ``powering-on``, ...)."""
        return self.summary()[0]

    def summary(self) -> tuple[dict[str, int], int, int]:
        """In one pass over the nodes (``GetStatus`` is polled): :meth:`counts`, the GPUs of nodes not
        LOST, and the GPUs reserved on every node."""
        by_key: dict[tuple[NodeState, int], int] = {}
        gpus_total = gpus_reserved = 0
        lost = NodeState.LOST
        for entry in self._nodes.values():
            record = entry.record
            state = entry.state
            key = (state, record.power_state)
            by_key[key] = by_key.get(key, 0) + 1
            if state != lost:
                gpus_total += len(record.inventory.gpus)
            gpus_reserved += len(entry.reservation.gpu_indices)
        out: dict[str, int] = {}
        for (state, power_state), n in by_key.items():   # labels once per kind, not per node
            power = power_label(power_state)
            label = state.label if power == "ready" else power
            out[label] = out.get(label, 0) + n
        return out, gpus_total, gpus_reserved

    def schedulable(self, entry: NodeEntry) -> bool:
        """May new work be placed here? (Ready, powered on by the Resource Adaptor, and not waiting for its
        health check's first verdict.)"""
        return entry.state == NodeState.READY and entry.record.power_state in _POWER_ON and not entry.health_pending
