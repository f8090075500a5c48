"""Node lifecycle on the leader: agent streams come and go, telemetry flows in, admins cordon and drain.

Drain, as in Slurm: the node is cordoned (nothing new lands on it) and marked draining; tasks that
were placed there but have not started yet are handed back to the queue (``SCHEDULED →
PREEMPTED → PENDING``), so they start elsewhere; tasks already running run to completion. When
the node holds no task any more an event says it is drained, and ``gptrmctl uncordon`` returns
it to service. Cordon, uncordon and drain take the ``drain`` etcd lock.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Sequence

from common.errors import GptrmError, NotFound, ValidationError
from common.logging import get_logger
from common.pb.gptrm.v1 import agent_pb2, types_pb2
from common.pbenum import pb_enum
from common.types import NodeState, TaskState
from coordinator.dispatch.dispatcher import Dispatcher
from coordinator.dispatch.reconcile import Reconciler
from coordinator.events import EventBus
from coordinator.health import GpuHealthWatch
from coordinator.monitor.metrics import Metrics
from coordinator.monitor.nodes import NodeEntry, NodeRegistry
from coordinator.monitor.resources import ResourceMonitor
from coordinator.state import LeaderState
from coordinator.sync.leadership import Leadership
from coordinator.sync.lock import AdminLocks
from coordinator.sync.store import Store
from coordinator.tasks import TaskTable

__all__ = ["NodeService", "NodeWrites"]

_DRAINED_BACK = "node drained before the task started: back in the queue"


class NodeWrites:
    """Node records written as agents register, batched: registrations that arrive while a write is under way
    share the next fenced transaction (:meth:`~coordinator.sync.store.Store.put_nodes`). After a leader change
    every agent registers again at once; one etcd round trip per registration would make the new leader see
    its cluster only after minutes.

    :param leadership: fenced writes.
    :param store: the store.
    :param max_batch: records per write at most.
    """

    def __init__(self, leadership: Leadership, store: Store, max_batch: int = 512) -> None:
        self._leadership, self._store, self._max = leadership, store, max_batch
        self._pending: list[tuple[types_pb2.NodeRecord, asyncio.Future[types_pb2.NodeRecord]]] = []
        self._writer: asyncio.Task[None] | None = None
        self.writes = 0   # transactions' worth of batches written (for tests and benchmarks)

    async def put(self, record: types_pb2.NodeRecord) -> types_pb2.NodeRecord:
        """Write one record (with the others waiting); the record as stored.

        :raises GptrmError: the batch's write failed (each of its callers gets the error).
        """
        future: asyncio.Future[types_pb2.NodeRecord] = asyncio.get_running_loop().create_future()
        self._pending.append((record, future))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        while self._pending:
            batch, self._pending = self._pending[: self._max], self._pending[self._max :]
            try:
                stored = await self._leadership.write(self._store.put_nodes, [r for r, _f in batch])
            except Exception as e:   # every waiter of this batch gets it; the next batch still goes
                for _r, future in batch:
                    if not future.done():
                        future.set_exception(e)
                continue
            self.writes += 1
            for (_r, future), record in zip(batch, stored, strict=True):
                if not future.done():
                    future.set_result(record)


class NodeService:
    """The leader's handling of nodes.

    :param registry: the node table.
    :param state: the leader's state (follows each node record etcd stored).
    :param monitor: the Resource Monitor (telemetry history).
    :param store: the fenced etcd store (``nodes/<id>``).
    :param leadership: leader check and fenced writes.
    :param locks: the admin locks (``drain``).
    :param tasks: the task table (drain hands unstarted tasks back).
    :param dispatcher: stops for tasks handed back.
    :param reconciler: reconciles an agent's tasks when it registers.
    :param metrics: stream, sample and drop counters.
    :param events: the cluster event log.
    :param health_drain_gpus: fenced GPUs at which a node is drained by health (0: never for that).
    :param on_health_change: called when GPUs come back in service or a health drain is lifted.
    """

    def __init__(self, registry: NodeRegistry, state: LeaderState, monitor: ResourceMonitor, store: Store,
                 leadership: Leadership, locks: AdminLocks, tasks: TaskTable, dispatcher: Dispatcher,
                 reconciler: Reconciler, metrics: Metrics, events: EventBus, *, health_drain_gpus: int = 2,
                 on_health_change: Callable[[], None] | None = None) -> None:
        self._registry, self._state, self._monitor = registry, state, monitor
        self._store, self._leadership = store, leadership
        self._locks, self._tasks, self._dispatcher, self._reconciler = locks, tasks, dispatcher, reconciler
        self._metrics, self._events = metrics, events
        self._drained: set[str] = set()   # draining nodes whose "drained" event went out
        self.registrations = NodeWrites(leadership, store)
        self.health = GpuHealthWatch(registry, state, leadership, self.registrations.put, tasks.update, events,
                                     drain_gpus=health_drain_gpus, on_drained=self._drain,
                                     on_change=on_health_change)
        """GPU fences, health drains and application XIDs from telemetry (``coordinator/health``)."""
        self._log = get_logger("coordinator")

    # ---- agent streams ------------------------------------------------------------------------

    async def connected(self, register: agent_pb2.Register, outbox: asyncio.Queue) -> NodeEntry:
        """An agent registered on a new stream: record it, persist it, reconcile its tasks."""
        inv = register.inventory
        entry, is_new = self._registry.connect(inv, outbox)
        self._metrics.streams.inc()
        self._log.info("node_registered", node_id=inv.node_id, gpus=len(inv.gpus), simulated=inv.simulated,
                       new=is_new)
        if is_new:
            self._events.publish("node_joined", f"node {inv.node_id} joined with {len(inv.gpus)} GPUs"
                                 + (" (simulated)" if inv.simulated else ""), node_id=inv.node_id)
        try:
            await self.registrations.put(entry.record)
        except GptrmError as e:
            self._log.warning("node_persist_failed", node_id=inv.node_id, reason=str(e))
        await self._reconciler.on_agent_registered(entry, register)
        return entry

    def disconnected(self, entry: NodeEntry, stream_id: int) -> None:
        """The stream ``stream_id`` of a node ended."""
        self._metrics.streams.dec()
        self._registry.disconnect(entry.node_id, stream_id)
        self._log.info("node_disconnected", node_id=entry.node_id)

    def pull_image(self, image: str, nodes: Sequence[str]) -> list[str]:
        """Tell ``nodes`` (none: every connected node that runs containers) to pull ``image`` into their stores;
        the nodes told.

        :raises NotFound: a node named that is not known.
        :raises ValidationError: on ``nodes``: a node named that is not connected or runs no containers.
        """
        if nodes:
            entries = []
            for node_id in nodes:
                entry = self._registry.get(node_id)
                if entry is None:
                    raise NotFound(f"node {node_id!r} not found")
                if not entry.connected or not entry.inventory.containers:
                    raise ValidationError("nodes", f"node {node_id!r} is not connected or runs no containers")
                entries.append(entry)
        else:
            entries = [e for e in self._registry if e.connected and e.inventory.containers]
        told = [e.node_id for e in entries if self._dispatcher.send(e.node_id, agent_pb2.Decision(
            decision_id=f"pull-{uuid.uuid4().hex[:10]}", pull_image=agent_pb2.PullImage(image=image)))]
        self._log.info("image_pull_requested", image=image, nodes=told)
        return told

    def images_held(self, entry: NodeEntry, held: agent_pb2.ImagesHeld) -> None:
        """The images the node's store holds now (shown by ``gptrmctl images``; in memory, the registration stores
        what it held then)."""
        self._registry.heartbeat(entry)
        self._registry.set_images(entry, (ref[:512] for ref in held.refs[:1024]))

    def telemetry(self, entry: NodeEntry, batch: agent_pb2.TelemetryBatch) -> None:
        """Hot path: store samples (the monitor refreshes the objectives lazily)."""
        self._registry.heartbeat(entry)
        samples = batch.samples
        if not samples:
            return
        last = samples[-1]   # the room its agent counts (placement reads it; unknown from an older agent)
        entry.task_uid_room = last.task_uid_room if last.HasField("task_uid_room") else None
        entry.task_ports_free = last.task_ports_free if last.HasField("task_ports_free") else None
        self.health.observe(entry, last)   # acts only when the GPUs' health or the health check changed
        stored = self._monitor.ingest(entry.node_id, len(entry.inventory.gpus), samples)
        self._metrics.samples.inc(stored)
        if stored < len(samples):
            self._metrics.rejected_samples.labels(entry.node_id).inc(len(samples) - stored)
            self._log.warning("telemetry_rejected", node_id=entry.node_id, samples=len(samples) - stored,
                              reason=self._monitor.last_rejection.get(entry.node_id, ""))
        self._metrics.ingest_lag.observe(self._monitor.last_lag_s)
        if batch.dropped_samples_total > entry.dropped_samples_total:
            self._metrics.dropped.inc(batch.dropped_samples_total - entry.dropped_samples_total)
            entry.dropped_samples_total = batch.dropped_samples_total

    async def watch(self, period_s: float = 0.5) -> None:
        """Re-derive node states; publish and (while leading) persist changes."""
        while True:
            await asyncio.sleep(period_s)
            for entry, old in self._registry.refresh():
                self._log.info("node_state_changed", node_id=entry.node_id, old=old.label, new=entry.state.label)
                self._events.publish("node_state", f"node {entry.node_id} {old.label} → {entry.state.label}",
                                     node_id=entry.node_id, old=old.label, new=entry.state.label)
                if entry.state in (NodeState.LOST, NodeState.NOT_READY) and not entry.connected:
                    self._monitor.deactivate(entry.node_id)
                if entry.state == NodeState.LOST and self._leadership.leading:
                    await self._reconciler.on_node_lost(entry.node_id)
                if self._leadership.leading:
                    try:
                        async with self._state.node_writes:
                            record = types_pb2.NodeRecord()
                            record.CopyFrom(entry.record)
                            record.state = pb_enum(types_pb2.NodeState, entry.state)
                            record.last_seen_unix_s = entry.last_seen_unix_s
                            self._state.apply_node(await self._leadership.write(self._store.put_node, record))
                    except GptrmError as e:  # logged, retried on the next change
                        self._log.warning("node_persist_failed", node_id=entry.node_id, reason=str(e))
            self._report_drained()

    # ---- admin state --------------------------------------------------------------------------

    async def set_admin_state(self, node_id: str, *, cordoned: bool | None = None,
                              draining: bool | None = None) -> NodeEntry:
        """Cordon, uncordon or drain a node under the ``drain`` lock; nothing is half-applied.

        :raises NotFound: no such node.
        :raises NotLeader: on a standby.
        """
        self._leadership.require_leader()
        entry = self._registry.get(node_id)
        if entry is None:
            raise NotFound(f"node {node_id!r} not found")
        async def change() -> None:   # run to its end once the lock is held, even if the caller goes away
            async with self._state.node_writes:
                record = types_pb2.NodeRecord()
                record.CopyFrom(entry.record)
                if cordoned is not None:
                    record.cordoned = cordoned
                if draining is not None:
                    record.draining = draining
                # Memory follows what etcd stored: a failed write changes nothing.
                self._state.apply_node(await self._leadership.write(self._store.put_node, record))
            self._drained.discard(node_id)
            self._events.publish("node_state", f"node {node_id} cordoned={entry.record.cordoned} "
                                 f"draining={entry.record.draining}", node_id=node_id)
            if draining:
                await self._drain(entry)

        await self._locks.run("drain", change)
        return entry

    async def _drain(self, entry: NodeEntry) -> None:
        """Hand back the node's placed-but-unstarted tasks; running ones run to completion."""
        back = 0
        for task_id in sorted(entry.task_ids):
            task = self._tasks.find(task_id)
            if task is None or task.state != TaskState.SCHEDULED:
                continue
            try:
                self._dispatcher.stop(task, _DRAINED_BACK)
                await self._tasks.transition(task_id, TaskState.PREEMPTED, _DRAINED_BACK, release=True)
                await self._tasks.transition(task_id, TaskState.PENDING, _DRAINED_BACK)
                back += 1
            except GptrmError as e:
                self._log.warning("drain_requeue_failed", node_id=entry.node_id, task_id=task_id, reason=str(e))
        self._log.info("node_draining", node_id=entry.node_id, tasks=len(entry.task_ids), requeued=back)

    def _report_drained(self) -> None:
        """One event per drain when the draining node holds no task any more."""
        for entry in self._registry:
            if entry.record.draining and not entry.task_ids and entry.node_id not in self._drained:
                self._drained.add(entry.node_id)
                self._log.info("node_drained", node_id=entry.node_id)
                self._events.publish("node_state", f"node {entry.node_id} drained: no task left; "
                                     "`gptrmctl uncordon` returns it to service", node_id=entry.node_id)
