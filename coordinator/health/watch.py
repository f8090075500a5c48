"""The leader's GPU health watch: telemetry in, fences, history, health drains and application XIDs out.

:meth:`GpuHealthWatch.observe` runs on the telemetry hot path: it compares a node's newest sample with the
last one it saw (state, action and reason per GPU, the application XID count, the health check) and only
on a change notes the node for the watch's next pass (a leader duty, :meth:`GpuHealthWatch.run`). A pass
brings each noted node's record in line with :mod:`coordinator.health.rules` and writes the changed
records together through :class:`~coordinator.nodes.NodeWrites` (fenced), under the node-record lock;
memory follows what etcd stored. Because the rules compare the agent's report with the stored record, a
new leader (the fences are in etcd) carries on from the first sample it receives.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence

from common.errors import GptrmError, NotFound
from common.logging import get_logger
from common.pb.gptrm.v1 import types_pb2
from common.types import TERMINAL_STATES, NodeState
from coordinator.events import EventBus
from coordinator.health import rules
from coordinator.monitor.nodes import NodeEntry, NodeRegistry
from coordinator.state import LeaderState
from coordinator.sync.leadership import Leadership

__all__ = ["GpuHealthWatch"]

_PENDING = types_pb2.HEALTH_CHECK_STATE_PENDING

Writer = Callable[[types_pb2.NodeRecord], Awaitable[types_pb2.NodeRecord]]
TaskUpdate = Callable[..., Awaitable[types_pb2.Task]]


class GpuHealthWatch:
    """See the module docstring.

    :param registry: the node table (``NodeEntry.degraded_gpus`` and ``health_pending`` are set here).
    :param state: the leader's state (the node-record lock, records as stored, tasks).
    :param leadership: the leader check.
    :param write: writes one node record, fenced (batched with others: ``NodeWrites.put``).
    :param update_task: persists task fields (``TaskTable.update``), for application XIDs.
    :param events: the cluster event log (kind ``health``).
    :param drain_gpus: fenced GPUs at which the node itself is drained (0: never for that).
    :param on_drained: called with a node the watch just drained (hands back its unstarted tasks).
    :param on_change: called after GPUs came back or a drain was lifted (wakes the scheduler).
    :param on_fenced: called with ``(node_id, fence)`` for each GPU newly fenced (moves its work).
    :param now: wall clock.
    """

    def __init__(self, registry: NodeRegistry, state: LeaderState, leadership: Leadership, write: Writer,
                 update_task: TaskUpdate, events: EventBus, *, drain_gpus: int = 2,
                 on_drained: Callable[[NodeEntry], Awaitable[None]] | None = None,
                 on_change: Callable[[], None] | None = None,
                 on_fenced: Callable[[str, types_pb2.GpuFence], None] | None = None,
                 now: Callable[[], float] = time.time) -> None:
        self._registry, self._state, self._leadership = registry, state, leadership
        self._write, self._update_task, self._events = write, update_task, events
        self.drain_gpus = drain_gpus
        self._on_drained, self._on_change, self.on_fenced = on_drained, on_change, on_fenced
        self._now = now
        self._seen: dict[str, tuple[object, ...]] = {}
        self._reports: dict[str, dict[int, types_pb2.GpuHealth]] = {}
        self._checks: dict[str, types_pb2.NodeHealthCheck] = {}
        self._first_unhealthy: dict[tuple[str, int], float] = {}
        self._xid_counts: dict[tuple[str, int], tuple[int, int]] = {}   # (node, gpu) → (stream id, count)
        self._xids: list[types_pb2.AppXid] = []
        self._dirty: set[str] = set()
        self._wake = asyncio.Event()
        self.passes = 0   # passes that wrote something (tests)
        self._log = get_logger("coordinator")

    # ---- the hot path --------------------------------------------------------------------------------

    def observe(self, entry: NodeEntry, sample: types_pb2.TelemetrySample) -> None:
        """A node's newest sample arrived: note it for the next pass when its health changed (cheap otherwise)."""
        check = sample.health_check
        key = (entry.stream_id, check.state, check.message,
               *[(g.index, g.healthy, g.health.state, g.health.action, g.health.reason, g.health.app_xid_count)
                 for g in sample.gpus])
        node_id = entry.node_id
        if self._seen.get(node_id) == key:
            return
        self._seen[node_id] = key
        reports = {g.index: rules.effective(g) for g in sample.gpus}
        now = self._now()
        for index, h in reports.items():
            first = (node_id, index)
            if h.state == rules.UNHEALTHY:
                self._first_unhealthy.setdefault(first, now)
            else:
                self._first_unhealthy.pop(first, None)
            self._count_xids(entry, index, h)
        self._reports[node_id] = reports
        self._checks[node_id] = types_pb2.NodeHealthCheck(state=check.state, message=check.message)
        self._registry.set_health(entry, frozenset(i for i, h in reports.items() if h.state == rules.DEGRADED),
                                  check.state == _PENDING)
        self._dirty.add(node_id)
        self._wake.set()

    def _count_xids(self, entry: NodeEntry, index: int, h: types_pb2.GpuHealth) -> None:
        """Note an application XID when the GPU's count rose (or, on a new stream, is not zero: the record
        on the task is kept once per XID time, so a count seen again adds nothing)."""
        key = (entry.node_id, index)
        last = self._xid_counts.get(key)
        self._xid_counts[key] = (entry.stream_id, h.app_xid_count)
        rose = h.app_xid_count > 0 if last is None or last[0] != entry.stream_id else h.app_xid_count > last[1]
        if rose and h.app_xid_last:
            self._xids.append(types_pb2.AppXid(time_unix_s=h.app_xid_unix_s or self._now(), node_id=entry.node_id,
                                               gpu_index=index, xid=h.app_xid_last))

    def forget(self, node_id: str) -> None:
        """The node was removed: drop what the watch keeps for it."""
        for table in (self._seen, self._reports, self._checks):
            table.pop(node_id, None)
        for key in [k for k in self._first_unhealthy if k[0] == node_id]:
            del self._first_unhealthy[key]
        for key in [k for k in self._xid_counts if k[0] == node_id]:
            del self._xid_counts[key]
        self._dirty.discard(node_id)

    # ---- the leader's passes -------------------------------------------------------------------------

    async def run(self, beat: Callable[[], None] = lambda: None, period_s: float = 0.5) -> None:
        """While leading: a pass whenever a noted change waits (every node seen so far is judged again at the
        start, against the records this leader adopted)."""
        self._dirty.update(self._reports)
        while True:
            self._wake.clear()
            await self.step()
            beat()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), period_s)

    async def step(self) -> int:
        """One pass: write what changed for the noted nodes; returns the records written."""
        if not self._leadership.leading:
            return 0
        written = 0
        if self._dirty:
            nodes, self._dirty = sorted(self._dirty), set()
            written = await self._apply(nodes)
        if self._xids:
            xids, self._xids = self._xids, []
            await self._record_xids(xids)
        if written:
            self.passes += 1
        return written

    async def _apply(self, node_ids: Sequence[str]) -> int:
        now = self._now()
        planned: list[tuple[NodeEntry, types_pb2.NodeRecord, list[rules.Change]]] = []
        drained: list[NodeEntry] = []
        done: list[tuple[NodeEntry, list[rules.Change]]] = []
        async with self._state.node_writes:
            for node_id in node_ids:
                entry = self._registry.get(node_id)
                if entry is None:
                    continue
                record = types_pb2.NodeRecord()
                record.CopyFrom(entry.record)
                first = {i: t for (n, i), t in self._first_unhealthy.items() if n == node_id}
                uuids = {g.index: g.uuid for g in entry.inventory.gpus}
                changes = rules.apply_reports(record, self._reports.get(node_id, {}), now, uuids=uuids,
                                              first_seen=first)
                drain = rules.apply_drain(record, rules.drain_cause(record, self._checks.get(node_id),
                                                                    self.drain_gpus))
                if drain is not None:
                    changes.append(drain)
                if changes:
                    planned.append((entry, record, changes))
            if not planned:
                return 0
            results = await asyncio.gather(*(self._write(r) for _e, r, _c in planned), return_exceptions=True)
            for (entry, _record, changes), stored in zip(planned, results, strict=True):
                if isinstance(stored, BaseException):
                    if not isinstance(stored, GptrmError):
                        raise stored
                    self._log.warning("gpu_health_persist_failed", node_id=entry.node_id, reason=str(stored))
                    self._dirty.add(entry.node_id)   # judged again at the next pass
                    continue
                self._state.apply_node(stored)
                self._publish(entry.node_id, changes)
                done.append((entry, changes))
                if any(c.gpu < 0 and c.state == "drained" for c in changes) and not entry.record.draining:
                    drained.append(entry)
        back = False
        for entry, changes in done:
            for c in changes:
                back = back or c.lifted or c.state == "undrained"
                if c.state == "unhealthy" and self.on_fenced is not None:
                    fence = rules.fence_of(entry.record, c.gpu)
                    if fence is not None:
                        self.on_fenced(entry.node_id, fence)
        for entry in drained:
            if self._on_drained is not None:
                await self._on_drained(entry)
        if back and self._on_change is not None:
            self._on_change()
        return len(done)

    def _publish(self, node_id: str, changes: Sequence[rules.Change], task_id: str = "") -> None:
        for c in changes:
            self._log.info("gpu_health_changed", node_id=node_id, gpu=c.gpu, state=c.state, reason=c.reason,
                           evidence=c.evidence, by=c.by, action=c.action, lifted=c.lifted)
            fields: dict[str, object] = {"state": c.state, "reason": c.reason, "by": c.by}
            if c.gpu >= 0:
                fields.update(gpu=c.gpu, evidence=c.evidence)
            if c.action:
                fields["action"] = c.action
            self._events.publish("health", c.message(node_id), node_id=node_id, task_id=task_id, **fields)

    async def _record_xids(self, xids: Sequence[types_pb2.AppXid]) -> None:
        """Each application XID on the task that held its GPU at that time; one write per task per pass."""
        by_task: dict[str, list[types_pb2.AppXid]] = {}
        for xid in xids:
            holder = self._holder(xid)
            self._log.info("gpu_app_xid", node_id=xid.node_id, gpu=xid.gpu_index, xid=xid.xid,
                           task_id=holder or "")
            if holder is None:
                self._events.publish("health", f"{xid.node_id} GPU {xid.gpu_index} application xid {xid.xid} "
                                     "(no task held it)", node_id=xid.node_id, gpu=xid.gpu_index, state="healthy",
                                     reason=f"application xid {xid.xid}", evidence=f"xid={xid.xid}", by=rules.AGENT)
                continue
            by_task.setdefault(holder, []).append(xid)
        for task_id, found in by_task.items():
            task = self._state.tasks.get(task_id)
            if task is None:
                continue
            copy = types_pb2.Task()
            copy.CopyFrom(task)
            new = [x for x in found if rules.add_app_xid(copy, x)]
            if not new:
                continue
            try:
                await self._update_task(task_id, app_xids=list(copy.app_xids))
            except (GptrmError, NotFound) as e:
                self._log.warning("gpu_app_xid_persist_failed", task_id=task_id, reason=str(e))
                continue
            for x in new:
                self._events.publish("health", f"task {task_id}: application xid {x.xid} on {x.node_id} GPU "
                                     f"{x.gpu_index} (the task's fault; the GPU stays in service)",
                                     node_id=x.node_id, task_id=task_id, gpu=x.gpu_index, state="healthy",
                                     reason=f"application xid {x.xid}", evidence=f"xid={x.xid}", by=rules.AGENT)

    def _holder(self, xid: types_pb2.AppXid) -> str | None:
        """The unfinished task that held the XID's GPU when it happened (placed before it)."""
        entry = self._registry.get(xid.node_id)
        if entry is None:
            return None
        for task_id in sorted(entry.task_ids):
            task = self._state.tasks.get(task_id)
            if task is None or task.state in TERMINAL_STATES:
                continue
            if task.allocation.created_unix_s and task.allocation.created_unix_s > xid.time_unix_s:
                continue
            for na in task.allocation.nodes:
                if na.node_id == xid.node_id and xid.gpu_index in na.gpu_indices:
                    return task_id
        return None

    # ---- an admin's resume ---------------------------------------------------------------------------

    async def resume(self, node_id: str, indices: Sequence[int], by: str) -> NodeEntry:
        """Put fenced GPUs of a node back in service (``indices`` empty: all of them); the node's health drain
        is judged again at once.

        :raises NotFound: no such node.
        :raises ValidationError: a GPU the node does not have, or that is not fenced (nothing changed).
        :raises NotLeader: on a standby.
        """
        self._leadership.require_leader()
        entry = self._registry.get(node_id)
        if entry is None:
            raise NotFound(f"node {node_id!r} not found")
        async with self._state.node_writes:
            record = types_pb2.NodeRecord()
            record.CopyFrom(entry.record)
            changes = rules.apply_resume(record, list(indices), by, self._now())
            drain = rules.apply_drain(record, rules.drain_cause(record, self._checks.get(node_id), self.drain_gpus))
            if drain is not None:
                changes.append(drain)
            self._state.apply_node(await self._write(record))
        self._publish(node_id, changes)
        if self._on_change is not None:
            self._on_change()
        return entry

    # ---- reads ---------------------------------------------------------------------------------------

    def fenced_holders(self) -> list[tuple[str, str, types_pb2.GpuFence]]:
        """``(task id, node id, fence)`` for every unfinished task placed on a fenced GPU, in node and task order:
        the level-triggered question for whoever moves work off fenced GPUs (``on_fenced`` fires only for fences
        this leader writes; a fence a former leader wrote is found here)."""
        out = []
        for entry in sorted(self._registry, key=lambda e: e.node_id):
            fences = rules.fenced(entry.record)
            if not fences or not entry.holds_tasks:
                continue
            for task_id in sorted(entry.task_ids):
                task = self._state.tasks.get(task_id)
                if task is None or task.state in TERMINAL_STATES:
                    continue
                for na in task.allocation.nodes:
                    if na.node_id != entry.node_id:
                        continue
                    for i in na.gpu_indices:
                        if i in fences:
                            out.append((task_id, entry.node_id, fences[i]))
        return out

    def counts(self) -> dict[str, int]:
        """GPUs of nodes not LOST by health: ``unhealthy`` (fenced), ``degraded`` (reported so), ``healthy``."""
        out = {"healthy": 0, "degraded": 0, "unhealthy": 0}
        for entry in self._registry:
            if entry.state == NodeState.LOST:
                continue
            fences = {f.gpu_index for f in entry.record.gpu_fences}
            for g in entry.inventory.gpus:
                if g.index in fences:
                    out["unhealthy"] += 1
                elif g.index in entry.degraded_gpus:
                    out["degraded"] += 1
                else:
                    out["healthy"] += 1
        return out
