"""The coordinator's state and what it does with it, apart from the wire.

:class:`Coordinator` owns the node registry, the Resource Monitor, the task table and the
event bus. While this replica holds the etcd leader key it accepts agent streams and
admin writes, persists through the fenced :class:`~coordinator.sync.Store`, and runs the
scheduler; as a standby it only redirects. Blocking etcd calls run in worker threads so
the asyncio loop keeps serving streams.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any

from common.errors import EtcdUnavailable, Fenced, NotFound, NotLeader, ValidationError
from common.logging import get_logger
from common.pb.gptrm.v1 import agent_pb2, types_pb2
from common.types import TERMINAL_STATES, NodeState, TaskState
from coordinator.config import CoordinatorConfig
from coordinator.events import EventBus
from coordinator.metrics import Metrics
from coordinator.monitor import ResourceMonitor
from coordinator.registry import NodeEntry, NodeRegistry

__all__ = ["VERSION", "Coordinator"]

VERSION = "0.1.0"


class Coordinator:
    """Shared state of one coordinator replica.

    :param cfg: frozen configuration.
    :param store: fenced etcd store (``coordinator.sync.Store``).
    :param election: the replica's ``coordinator.sync.Election``.
    """

    def __init__(self, cfg: CoordinatorConfig, store: Any, election: Any, *,
                 now: Callable[[], float] = time.monotonic) -> None:
        self.cfg = cfg
        self.store = store
        self.election = election
        self.id = cfg.replica_id
        self._now = now
        self.started = now()
        self.registry = NodeRegistry(cfg.heartbeat_interval_s, cfg.lost_grace_s, now=now)
        self.monitor = ResourceMonitor(cfg.history_s, cfg.sampling_interval_s)
        self.events = EventBus()
        self.tasks: dict[str, types_pb2.Task] = {}
        self.policy = types_pb2.Policy(name=cfg.policy, threshold=cfg.threshold)
        self.metrics = Metrics(self.monitor, self.registry, self.task_counts)
        self.leading = False
        self.epoch = 0
        self.stale = False
        self._log = get_logger("coordinator").bind(leader_id=self.id)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._leader_tasks: list[asyncio.Task] = []
        self.scheduler: Any = None   # set by server wiring (coordinator.scheduling.SchedulerLoop)

    # ---- leadership -------------------------------------------------------------------------

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Bind to the running loop; election callbacks arrive on etcd threads and hop over."""
        self._loop = loop

    def on_elected(self, record: types_pb2.LeaderRecord) -> None:
        """Election callback (background thread)."""
        if self._loop:
            asyncio.run_coroutine_threadsafe(self._become_leader(record), self._loop)

    def on_lost(self, reason: str) -> None:
        """Election callback (background thread): stop acting at once."""
        if self._loop:
            self._loop.call_soon_threadsafe(self._stop_leading, reason)

    async def _become_leader(self, record: types_pb2.LeaderRecord) -> None:
        try:
            state = await asyncio.to_thread(self.store.load_all)
        except (EtcdUnavailable, Fenced) as e:
            self._log.warning("recovery_failed", reason=str(e))
            self.election.step_down(f"recovery failed: {e}")
            return
        if not self.election.is_leader:
            return
        for rec in state.nodes.values():
            entry = self.registry.get(rec.inventory.node_id)
            if entry is None:
                self.registry.load(rec)
            else:
                # Reservations and admin state come from etcd; inventory from the live stream.
                inventory = types_pb2.NodeInventory()
                inventory.CopyFrom(entry.record.inventory)
                entry.record.CopyFrom(rec)
                entry.record.inventory.CopyFrom(inventory)
        self.tasks = dict(state.tasks)
        for entry in self.registry:
            entry.task_ids.clear()
        for task in self.tasks.values():
            if task.state not in TERMINAL_STATES:
                for na in task.allocation.nodes:
                    node = self.registry.get(na.node_id)
                    if node is not None:
                        node.task_ids.add(task.id)
        if state.policy is not None and state.policy.name:
            self.policy = state.policy
        else:
            try:
                await self.write_as_leader(self.store.put_policy, self.policy)
            except Exception as e:  # retried at the next policy change
                self._log.warning("policy_persist_failed", reason=str(e))
        self.epoch = record.epoch
        self.leading = True
        self.stale = False
        self.metrics.is_leader.set(1)
        self._log.info("leadership_acquired", epoch=record.epoch, nodes=len(state.nodes), tasks=len(state.tasks))
        self.events.publish("leader", f"{self.id} leads (epoch {record.epoch})", leader_id=self.id,
                            epoch=record.epoch)
        if self.scheduler is not None:
            self._leader_tasks.append(asyncio.create_task(self.scheduler.run(self)))
            self._leader_tasks.append(asyncio.create_task(self.scheduler.reconcile_after_grace(self)))

    def _stop_leading(self, reason: str) -> None:
        if not self.leading:
            return
        self.leading = False
        self.metrics.is_leader.set(0)
        for t in self._leader_tasks:
            t.cancel()
        self._leader_tasks.clear()
        self._log.warning("leadership_lost", reason=reason)
        self.events.publish("leader", f"{self.id} stopped leading: {reason}", leader_id=self.id, reason=reason)
        redirect = self._redirect_message()
        for entry in self.registry:
            if entry.outbox is not None:
                entry.outbox.put_nowait(redirect)
                entry.outbox.put_nowait(None)

    def leader_info(self) -> tuple[str, str, int]:
        """(leader id, leader address, epoch) as last observed."""
        # The election's own view (watch + campaigns) costs no etcd read; ask etcd only when it has none.
        rec = self.election.observe() or self.election.leader()
        if rec is None:
            return "", "", 0
        return rec.coordinator_id, rec.address, rec.epoch

    def require_leader(self) -> None:
        """:raises NotLeader: with the leader's address when this replica is a standby."""
        if not self.leading or not self.election.is_leader:
            leader_id, address, _ = self.leader_info()
            raise NotLeader(f"{self.id} is not the leader" + (f"; the leader is {leader_id} at {address}"
                                                                if leader_id else "; no leader elected yet"),
                            leader_id, address)

    def _redirect_message(self) -> agent_pb2.CoordinatorMessage:
        leader_id, address, _ = self.leader_info()
        if leader_id == self.id:
            leader_id, address = "", ""
        return agent_pb2.CoordinatorMessage(redirect=agent_pb2.Redirect(leader_address=address, leader_id=leader_id))

    async def write(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run a fenced store write in a thread; etcd trouble marks our view stale.

        :raises NotLeader: this replica does not lead.
        :raises EtcdUnavailable: etcd is known to be unreachable (refused at once, nothing is
            half-applied) or stopped answering during the write.
        """
        self.require_leader()
        if self.stale:
            raise EtcdUnavailable("etcd is unreachable: writes are refused until it answers again "
                                  "(reads are served from memory, marked stale)")
        return await self.write_as_leader(fn, *args, **kwargs)

    async def write_as_leader(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Like :meth:`write` without the in-memory leader check (used during recovery); fencing still applies."""
        try:
            result = await asyncio.to_thread(fn, *args, **kwargs)
        except EtcdUnavailable as e:
            self._set_etcd_reachable(False, str(e))
            raise
        self._set_etcd_reachable(True)
        return result

    def _set_etcd_reachable(self, up: bool, reason: str = "") -> None:
        if up == (not self.stale):
            return
        self.stale = not up
        self.metrics.etcd_up.set(1 if up else 0)
        if up:
            self._log.info("etcd_recovered")
            self.events.publish("etcd", "etcd reachable again: writes and scheduling resume")
            if self.scheduler is not None:
                self.scheduler.wake()
        else:
            self._log.warning("etcd_unreachable", reason=reason)
            self.events.publish("etcd", f"etcd unreachable: scheduling and writes stop, reads are stale ({reason})")

    async def watch_etcd(self, period_s: float = 0.5) -> None:
        """Probe etcd (a read of the leader key) every ``period_s``, on every replica.

        While it does not answer, this replica is *stale*: the scheduler pauses, writes are
        refused with ``UNAVAILABLE``, and reads are served from memory with ``stale`` set. The
        first answer clears it, with no operator action. (An outage longer than the lease TTL
        also costs the leader its lease; it then steps down, and leads again after re-election.)
        """
        while True:
            try:
                await asyncio.to_thread(self.election.leader)
            except EtcdUnavailable as e:
                self._set_etcd_reachable(False, str(e))
            except Exception as e:  # etcd answered with an error: it is reachable
                self._log.warning("etcd_probe_failed", reason=str(e))
                self._set_etcd_reachable(True)
            else:
                self._set_etcd_reachable(True)
            await asyncio.sleep(period_s)

    # ---- nodes ------------------------------------------------------------------------------

    async def node_connected(self, register: agent_pb2.Register, outbox: asyncio.Queue) -> NodeEntry:
        """An agent registered on a new stream."""
        inv = register.inventory
        entry, is_new = self.registry.connect(inv, outbox)
        self.metrics.streams.inc()
        log = self._log.bind(node_id=inv.node_id)
        log.info("node_registered", gpus=len(inv.gpus), simulated=inv.simulated, new=is_new)
        if is_new:
            self.events.publish("node_joined", f"node {inv.node_id} joined with {len(inv.gpus)} GPUs"
                                + (" (simulated)" if inv.simulated else ""), node_id=inv.node_id)
        try:
            await self.write(self.store.put_node, entry.record)
        except (EtcdUnavailable, Fenced) as e:
            log.warning("node_persist_failed", reason=str(e))
        if self.scheduler is not None:
            await self.scheduler.on_agent_registered(self, entry, register)
        return entry

    def node_disconnected(self, entry: NodeEntry, stream_id: int) -> None:
        self.metrics.streams.dec()
        self.registry.disconnect(entry.node_id, stream_id)
        self._log.info("node_disconnected", node_id=entry.node_id)

    def on_telemetry(self, entry: NodeEntry, batch: agent_pb2.TelemetryBatch) -> None:
        """Hot path: store samples and refresh objectives."""
        self.registry.heartbeat(entry)
        samples = batch.samples
        if not samples:
            return
        self.monitor.ingest(entry.node_id, len(entry.inventory.gpus), samples)
        self.metrics.samples.inc(len(samples))
        self.metrics.ingest_lag.observe(self.monitor.last_lag_s)
        if batch.dropped_samples_total > entry.dropped_samples_total:
            self.metrics.dropped.inc(batch.dropped_samples_total - entry.dropped_samples_total)
            entry.dropped_samples_total = batch.dropped_samples_total

    async def watch_nodes(self, period_s: float = 0.5) -> None:
        """Re-derive node states; publish and persist changes."""
        while True:
            await asyncio.sleep(period_s)
            for entry, old in self.registry.refresh():
                self._log.info("node_state_changed", node_id=entry.node_id, old=old.label, new=entry.state.label)
                self.events.publish("node_state", f"node {entry.node_id} {old.label} → {entry.state.label}",
                                    node_id=entry.node_id, old=old.label, new=entry.state.label)
                if entry.state in (NodeState.LOST, NodeState.NOT_READY) and not entry.connected:
                    self.monitor.deactivate(entry.node_id)
                if self.leading:
                    entry.record.state = int(entry.state)
                    entry.record.last_seen_unix_s = entry.last_seen_unix_s
                    try:
                        await self.write(self.store.put_node, entry.record)
                    except Exception as e:  # logged, retried on the next change
                        self._log.warning("node_persist_failed", node_id=entry.node_id, reason=str(e))

    async def set_node_admin_state(self, node_id: str, *, cordoned: bool | None = None,
                                   draining: bool | None = None) -> NodeEntry:
        self.require_leader()
        entry = self.registry.get(node_id)
        if entry is None:
            raise NotFound(f"node {node_id!r} not found")
        before = types_pb2.NodeRecord()
        before.CopyFrom(entry.record)
        self.registry.set_admin_state(node_id, cordoned=cordoned, draining=draining)
        try:
            await self.write(self.store.put_node, entry.record)
        except Exception:
            entry.record.CopyFrom(before)   # nothing half-applied
            self.registry.refresh()
            raise
        self.events.publish("node_state", f"node {node_id} cordoned={entry.record.cordoned} "
                            f"draining={entry.record.draining}", node_id=node_id)
        if draining and self.scheduler is not None:
            await self.scheduler.drain(self, entry)
        return entry

    # ---- tasks ------------------------------------------------------------------------------

    def task_counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in list(self.tasks.values()):
            label = TaskState(t.state).label if t.state else "unknown"
            out[label] = out.get(label, 0) + 1
        return out

    def get_task(self, task_id: str) -> types_pb2.Task:
        task = self.tasks.get(task_id)
        if task is None:
            raise NotFound(f"task {task_id!r} not found")
        return task

    async def submit(self, spec: types_pb2.TaskSpec, request_id: str) -> types_pb2.Task:
        """Validate, profile and persist a new PENDING task (idempotent per ``request_id``)."""
        self.require_leader()
        if self.scheduler is None:
            raise ValidationError("spec", "this coordinator has no scheduler")
        task = self.scheduler.prepare(self, spec)
        task.id = f"t-{uuid.uuid4().hex[:10]}"
        task.submit_unix_s = time.time()
        stored = await self.write(self.store.create_task, task, request_id)
        self.tasks[stored.id] = stored
        if stored.id == task.id:
            self._log.info("task_submitted", task_id=stored.id, name=spec.name)
            self.events.publish("task_state", f"task {stored.id} submitted", task_id=stored.id, state="pending")
        if self.scheduler is not None:
            self.scheduler.wake()
        return stored

    async def transition(self, task_id: str, state: TaskState, reason: str = "", **updates: Any) -> types_pb2.Task:
        """Persist a state change of a task (compare-on-revision) and update memory."""
        task = self.get_task(task_id)
        stored = await self.write(self.store.transition, task_id, task.revision, state, reason, **updates)
        self.tasks[task_id] = stored
        self.events.publish("task_state", f"task {task_id} {TaskState(task.state).label} → {state.label}"
                            + (f": {reason}" if reason else ""), task_id=task_id, state=state.label)
        if state in TERMINAL_STATES and self.scheduler is not None:
            await self.scheduler.on_task_finished(self, stored)
        return stored

    async def set_policy(self, policy: types_pb2.Policy) -> types_pb2.Policy:
        self.require_leader()
        if self.scheduler is not None:
            self.scheduler.validate_policy(policy)
        await self.write(self.store.put_policy, policy)
        self.policy = policy
        self.events.publish("policy", f"policy {policy.name} threshold {policy.threshold:.2f}",
                            policy=policy.name, threshold=policy.threshold)
        if self.scheduler is not None:
            self.scheduler.wake()
        return policy
