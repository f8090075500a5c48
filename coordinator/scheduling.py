"""The scheduler loop on the leader: queue → snapshot → policy → allocator → etcd → agents.

One cycle, in this order (each step needs the previous one's output):

1. queue: PENDING tasks ordered by priority, then deadline, then submit time;
2. snapshot: READY nodes with their reservations and free GPUs, taken once per cycle so
   every policy reads the same consistent view;
3. placement: the production engine (policy filter + rank, then the Resource Allocator's
   GPU choice) decides the whole batch;
4. commit: placements go to etcd in batched, fenced transactions (task → SCHEDULED,
   allocation, node reservation, all or nothing per placement);
5. push: only committed placements become StartTask decisions on the agents' streams.

Tasks that do not fit keep a human-readable reason; under max-utilization and
load-balancing an unplaceable task also raises a scale-out request event (on bare metal
the request waits), under power-efficient it simply waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from dataclasses import dataclass
from typing import Any

from common.errors import GptrmError, IllegalTransition, NotFound, ValidationError
from common.logging import get_logger
from common.pb.gptrm.v1 import agent_pb2, types_pb2
from common.scheduling import (
    ClusterSnapshot,
    GpuSlot,
    NodeSnapshot,
    Placement,
    PowerCurve,
    Request,
    Resources,
    queue_key,
)
from common.types import TERMINAL_STATES, NodeState, TaskState
from coordinator.config import CoordinatorConfig
from coordinator.placement import PlacementEngine
from coordinator.policies import POLICIES
from coordinator.power_model import PowerModel
from coordinator.profiler import Profiler, gpus_used, validate_spec
from coordinator.registry import NodeEntry
from coordinator.sync import add_reservation, remove_reservation

__all__ = ["SchedulerLoop"]

_SCALE_OUT_POLICIES = ("max-utilization", "load-balancing")
_FORCED_CYCLE_S = 30.0   # a cycle runs at least this often even when nothing seems to have changed
_ACTIVE = (TaskState.SCHEDULED, TaskState.STARTING, TaskState.RUNNING, TaskState.PAUSED)
_RESTART = {types_pb2.RESTART_POLICY_ON_FAILURE: (TaskState.FAILED,),
            types_pb2.RESTART_POLICY_ALWAYS: (TaskState.FAILED, TaskState.SUCCEEDED)}


def _request(task: types_pb2.Task) -> Request:
    d, spec = task.demand, task.spec
    return Request(
        task_id=task.id,
        demand=Resources(gpus=d.gpus, gpu_mem_bytes=d.gpu_mem_bytes * gpus_used(d.gpus), cpu_cores=d.cpu_cores,
                         mem_bytes=d.mem_bytes, disk_bytes=d.disk_bytes),
        nodes=max(1, spec.nodes), gpu_mem_per_gpu_bytes=d.gpu_mem_bytes, priority=spec.priority,
        submit_s=task.submit_unix_s, deadline_s=spec.qos.deadline_unix_s or None,
        gpu_model=spec.constraints.gpu_model, node_selector=dict(spec.constraints.node_selector),
        allow_sharing=spec.allow_gpu_sharing,
    )


@dataclass(frozen=True, slots=True)
class _NodeStatic:
    """What a node's snapshot takes from its inventory (see :meth:`SchedulerLoop.snapshot`).

    :param check: (stream id, GPU count, cores, memory, disk): the inventory it was built from.
    :param capacity: the node's capacity vector.
    :param slots: ``(index, memory, topology group)`` per GPU (-1: topology unknown).
    :param free: every GPU as a fully free slot.
    :param model: the first GPU's model ("" without GPUs).
    :param gpu_mem_bytes: one GPU's memory (for the datasheet power guess of unknown models).
    :param labels: the node's labels (shared by snapshots; never modified).
    """

    check: tuple[int, int, int, int, int]
    capacity: Resources
    slots: tuple[tuple[int, int, int], ...]
    free: tuple[GpuSlot, ...]
    model: str
    gpu_mem_bytes: int
    labels: dict[str, str]


class SchedulerLoop:
    """Everything the leader does with tasks.

    :param cfg: coordinator configuration.
    """

    def __init__(self, cfg: CoordinatorConfig) -> None:
        self.cfg = cfg
        self.profiler = Profiler()
        self.power = PowerModel()
        self._wake = asyncio.Event()
        self._log = get_logger("scheduler")
        self._reported: dict[str, set[str]] = {}      # node id → task ids its agent reported since we lead
        self._scale_out_sent: set[str] = set()
        self.cycles = 0
        self.skipped = 0                                # cycles skipped: nothing changed since all waited
        self._idle: tuple[tuple, float] | None = None   # (inputs, time) of the last cycle that placed nothing
        self._statics: dict[str, _NodeStatic] = {}       # node id -> inventory-derived part of its snapshot

    # ---- admission --------------------------------------------------------------------------

    def validate_policy(self, policy: types_pb2.Policy) -> None:
        if policy.name not in POLICIES:
            raise ValidationError("name", f"unknown policy {policy.name!r} (known: {', '.join(sorted(POLICIES))})")

    def prepare(self, core: Any, spec: types_pb2.TaskSpec) -> types_pb2.Task:
        """Validate and profile a spec into a new PENDING task (nothing is stored yet)."""
        max_gpus = max((len(e.inventory.gpus) for e in core.registry if e.state != NodeState.LOST), default=0)
        validate_spec(spec, max_gpus_per_node=max_gpus)
        demand = self.profiler.profile(spec).to_proto()
        return types_pb2.Task(spec=spec, state=int(TaskState.PENDING), demand=demand,
                              reason="waiting for the scheduler")

    def wake(self) -> None:
        self._wake.set()

    # ---- the cycle --------------------------------------------------------------------------

    async def run(self, core: Any) -> None:
        """Schedule while leading; a cycle runs on every wake-up and at least once a second."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=1.0)
            self._wake.clear()
            if core.stale:
                continue
            try:
                await self.cycle(core)
            except GptrmError as e:
                self._log.warning("schedule_cycle_failed", reason=str(e))

    def snapshot(self, core: Any) -> ClusterSnapshot:
        """READY nodes with reservations and per-GPU free memory/share, in node-id order.

        What a node's snapshot takes from its inventory (capacity, GPU slots, model, labels) is
        built once per agent stream and reused; an idle node's all-free GPU tuple is reused too,
        so a cycle only builds what reservations change.
        """
        usage: dict[str, dict[int, tuple[int, float]]] = {}
        for task in core.tasks.values():
            if task.state in TERMINAL_STATES or not task.allocation.nodes:
                continue
            for na in task.allocation.nodes:
                n = max(1, len(na.gpu_indices))
                on_node = usage.setdefault(na.node_id, {})
                for i in na.gpu_indices:
                    mem, share = on_node.get(i, (0, 0.0))
                    on_node[i] = (mem + na.demand.gpu_mem_bytes // n, share + (na.gpu_share or 1.0))
        nodes = []
        schedulable = core.registry.schedulable
        for e in sorted(core.registry, key=lambda e: e.node_id):
            if not schedulable(e):
                continue
            static = self._static_part(e)
            taken = usage.get(e.node_id)
            if taken is None:
                gpus = static.free
            else:
                gpus = tuple(GpuSlot(i, total, max(0, total - taken.get(i, (0, 0.0))[0]),
                                     max(0.0, 1.0 - taken.get(i, (0, 0.0))[1]), group)
                             for i, total, group in static.slots)
            r = e.record.reserved
            nodes.append(NodeSnapshot(
                node_id=e.node_id, capacity=static.capacity,
                used=Resources(gpus=r.gpus, gpu_mem_bytes=r.gpu_mem_bytes, cpu_cores=r.cpu_cores,
                               mem_bytes=r.mem_bytes, disk_bytes=r.disk_bytes),
                gpus=gpus, gpu_model=static.model, labels=static.labels, schedulable=True,
                power=self.power_curve(e)[0]))
        return ClusterSnapshot(nodes=tuple(nodes), taken_at_s=time.time())

    def power_curve(self, entry: NodeEntry) -> tuple[PowerCurve, str, int]:
        """The node's GPU power curve as Alg. 3 sees it, with its source (see :meth:`PowerModel.explain`).

        :param entry: the node.
        :returns: ``(curve, "fitted" or "datasheet", samples in its fit window)``.
        """
        static = self._static_part(entry)
        return self.power.explain(entry.node_id, static.model, len(static.slots), static.gpu_mem_bytes)

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
            capacity=Resources(gpus=float(len(slots)), gpu_mem_bytes=sum(total for _, total, _ in slots),
                               cpu_cores=float(inv.cpu_cores), mem_bytes=inv.mem_total_bytes,
                               disk_bytes=inv.disk_total_bytes),
            slots=slots,
            free=tuple(GpuSlot(i, total, total, 1.0, group) for i, total, group in slots),
            model=inv.gpus[0].model if inv.gpus else "",
            gpu_mem_bytes=slots[0][1] if slots else 0,
            labels=dict(inv.labels),
        )
        self._statics[entry.node_id] = static
        return static

    def _inputs(self, core: Any) -> tuple:
        """Everything a cycle's decisions depend on, cheaply: the policy, every unfinished task's state
        and revision (demands, allocations and thus per-GPU use follow from them; a task that ends
        leaves the set) and every node's state, admin flags, stream (inventory) and reservations.
        Power curves only rank, so they are left out."""
        policy = core.policy
        tasks = tuple((t.id, t.state, t.revision) for t in core.tasks.values() if t.state not in TERMINAL_STATES)
        nodes = []
        for e in core.registry:
            r = e.record.reserved
            nodes.append((e.node_id, e.state, e.stream_id, e.record.cordoned, e.record.draining,
                          r.gpus, r.gpu_mem_bytes, r.cpu_cores, r.mem_bytes, r.disk_bytes))
        return policy.name, policy.threshold, tasks, tuple(nodes)

    async def cycle(self, core: Any) -> int:
        """One scheduling cycle; returns the number of placements committed.

        When the last cycle placed nothing and none of its inputs changed since (:meth:`_inputs`),
        it would refuse the same tasks for the same reasons, so it is skipped — apart from one
        cycle every ``_FORCED_CYCLE_S`` as a safety net. Waiting tasks then cost a comparison per
        second instead of a cluster snapshot and a placement batch.
        """
        started = time.perf_counter()
        pending = [t for t in core.tasks.values() if t.state == TaskState.PENDING]
        if not pending:
            self._idle = None
            return 0
        inputs = self._inputs(core)
        if self._idle is not None and self._idle[0] == inputs and started - self._idle[1] < _FORCED_CYCLE_S:
            self.skipped += 1
            return 0
        self._idle = None
        requests = sorted((_request(t) for t in pending), key=queue_key)
        snapshot = self.snapshot(core)
        policy = core.policy
        engine = PlacementEngine.from_name(snapshot, policy.name, threshold=policy.threshold)
        decisions = engine.place_batch(requests)
        core.metrics.decision_latency.observe((time.perf_counter() - started) / max(1, len(requests)))
        commits, by_id = [], {t.id: t for t in pending}
        for decision in decisions:
            task = by_id[decision.task_id]
            if isinstance(decision, Placement):
                commits.append((task, task.revision, self._allocation(core, task, decision)))
                core.metrics.decisions.labels(outcome="placed").inc()
            else:
                core.metrics.decisions.labels(outcome="waiting").inc()
                await self._note_rejection(core, task, decision, policy.name)
        committed = await self._commit(core, commits) if commits else 0
        core.metrics.sched_latency.observe(time.perf_counter() - started)
        self.cycles += 1
        if not commits:
            self._idle = (inputs, started)
        return committed

    def _allocation(self, core: Any, task: types_pb2.Task, placement: Placement) -> types_pb2.Allocation:
        alloc = types_pb2.Allocation(task_id=task.id, leader_epoch=core.epoch,
                                     decision_id=f"d-{uuid.uuid4().hex[:12]}", created_unix_s=time.time())
        d = task.demand
        for a in placement.assignments:
            entry = core.registry.get(a.node_id)
            uuids = {g.index: g.uuid for g in entry.inventory.gpus} if entry else {}
            n = len(a.gpu_indices)
            alloc.nodes.append(types_pb2.NodeAllocation(
                node_id=a.node_id, gpu_indices=list(a.gpu_indices), gpu_uuids=[uuids.get(i, "") for i in a.gpu_indices],
                gpu_share=a.gpu_share,
                demand=types_pb2.ResourceVector(gpus=d.gpus, gpu_mem_bytes=d.gpu_mem_bytes * max(n, 1),
                                                cpu_cores=d.cpu_cores, mem_bytes=d.mem_bytes,
                                                disk_bytes=d.disk_bytes)))
        return alloc

    async def _commit(self, core: Any, commits: list) -> int:
        t0 = time.perf_counter()
        result = await core.write(core.store.commit_placements, commits)
        core.metrics.commit_latency.observe(time.perf_counter() - t0)
        for task, _rev, alloc in commits:
            if task.id not in result.committed:
                self._log.info("placement_not_committed", task_id=task.id, reason=str(result.rejected.get(task.id)))
                await self._refresh_task(core, task.id)
                continue
            stored = result.stored[task.id]
            core.tasks[task.id] = stored
            for na in alloc.nodes:
                entry = core.registry.get(na.node_id)
                if entry is not None:
                    add_reservation(entry.record, na)
                    entry.task_ids.add(task.id)
            nodes = ", ".join(f"{na.node_id}:{list(na.gpu_indices)}" for na in alloc.nodes)
            self._log.info("placement_committed", task_id=task.id, policy=core.policy.name, nodes=nodes,
                           decision_id=alloc.decision_id)
            core.events.publish("decision", f"task {task.id} placed on {nodes}", task_id=task.id,
                                policy=core.policy.name, decision_id=alloc.decision_id)
            self._push_start(core, stored)
        return len(result.committed)

    async def _refresh_task(self, core: Any, task_id: str) -> None:
        try:
            core.tasks[task_id] = await asyncio.to_thread(core.store.get_task, task_id)
        except NotFound:
            core.tasks.pop(task_id, None)

    async def _note_rejection(self, core: Any, task: types_pb2.Task, rejection: Any, policy: str) -> None:
        reason = rejection.reason
        if reason != task.reason:
            task.reason = reason   # in memory; shown by `gptrmctl tasks`, not worth an etcd write per cycle
        if policy in _SCALE_OUT_POLICIES and rejection.scale_out and task.id not in self._scale_out_sent:
            self._scale_out_sent.add(task.id)
            core.events.publish("scale_out", f"scale-out requested for task {task.id}: {reason}", task_id=task.id,
                                reason=reason)
            self._log.info("scale_out_requested", task_id=task.id, reason=reason)

    # ---- decisions to agents ----------------------------------------------------------------

    def _send(self, core: Any, node_id: str, decision: agent_pb2.Decision) -> bool:
        entry = core.registry.get(node_id)
        if entry is None or entry.outbox is None:
            return False
        decision.leader_epoch = core.epoch
        entry.outbox.put_nowait(agent_pb2.CoordinatorMessage(decision=decision))
        return True

    def _push_start(self, core: Any, task: types_pb2.Task) -> None:
        spec = task.spec
        for na in task.allocation.nodes:
            self._send(core, na.node_id, agent_pb2.Decision(
                decision_id=f"{task.allocation.decision_id}/{na.node_id}",
                start=agent_pb2.StartTask(task_id=task.id, gpu_indices=na.gpu_indices, gpu_uuids=na.gpu_uuids,
                                          argv=spec.argv, env=spec.env, stop_grace_s=spec.stop_grace_s or 10.0,
                                          run_as_user=spec.run_as_user,
                                          gpu_share=na.gpu_share, demand=na.demand)))

    async def on_agent_registered(self, core: Any, entry: NodeEntry, register: agent_pb2.Register) -> None:
        """Reconcile the agent's task table with ours, and re-send starts it has not seen."""
        reported = {s.task_id for s in register.tasks}
        self._reported.setdefault(entry.node_id, set()).update(reported)
        for status in register.tasks:
            task = core.tasks.get(status.task_id)
            if task is None or task.state in TERMINAL_STATES:
                self._log.warning("unknown_task_stopped", node_id=entry.node_id, task_id=status.task_id)
                core.events.publish("decision", f"stopping task {status.task_id} on {entry.node_id}: not known "
                                    "to the cluster", node_id=entry.node_id, task_id=status.task_id)
                self._send(core, entry.node_id, agent_pb2.Decision(
                    decision_id=f"stop-unknown-{status.task_id}-{uuid.uuid4().hex[:6]}",
                    stop=agent_pb2.StopTask(task_id=status.task_id, reason="unknown to the coordinator")))
        for task in list(core.tasks.values()):
            on_node = any(na.node_id == entry.node_id for na in task.allocation.nodes)
            if on_node and task.state == TaskState.SCHEDULED and task.id not in reported:
                self._push_start(core, task)

    async def on_decision_ack(self, core: Any, entry: NodeEntry, ack: agent_pb2.DecisionAck) -> None:
        if ack.ok or not ack.task_id:
            return
        task = core.tasks.get(ack.task_id)
        if task is not None and task.state in (TaskState.SCHEDULED, TaskState.STARTING):
            await self._fail_or_requeue(core, task, f"agent {entry.node_id} refused: {ack.reason}")

    async def on_task_status(self, core: Any, entry: NodeEntry, status: agent_pb2.TaskStatus) -> None:
        """Apply one task-status event from an agent (in order, before it is acknowledged)."""
        self._reported.setdefault(entry.node_id, set()).add(status.task_id)
        task = core.tasks.get(status.task_id)
        state = TaskState(status.state)
        if task is None:
            self._send(core, entry.node_id, agent_pb2.Decision(
                decision_id=f"stop-unknown-{status.task_id}-{uuid.uuid4().hex[:6]}",
                stop=agent_pb2.StopTask(task_id=status.task_id, reason="unknown to the coordinator")))
            return
        if task.state == state or task.state in TERMINAL_STATES:
            return   # re-delivered after a reconnect, or already final
        updates: dict[str, Any] = {"pids": list(status.pids)} if status.pids else {}
        if status.has_exit_code:
            updates.update(exit_code=status.exit_code, log_tail=status.log_tail[-4096:])
        try:
            if state == TaskState.RUNNING and task.state == TaskState.SCHEDULED:
                await core.transition(task.id, TaskState.STARTING, "", **updates)
            stored = await core.transition(task.id, state, status.reason, release=state in TERMINAL_STATES,
                                           **updates)
        except IllegalTransition as e:
            self._log.warning("task_status_rejected", task_id=task.id, node_id=entry.node_id, reason=str(e))
            await self._refresh_task(core, task.id)
            return
        if state == TaskState.FAILED:
            await self._maybe_restart(core, stored)

    async def on_task_finished(self, core: Any, task: types_pb2.Task) -> None:
        """Free in-memory reservations and let the profiler learn from what the task used."""
        for na in task.allocation.nodes:
            entry = core.registry.get(na.node_id)
            if entry is not None:
                remove_reservation(entry.record, na)
                entry.task_ids.discard(task.id)
        self._observe(core, task)
        self._scale_out_sent.discard(task.id)
        self.wake()

    def _observe(self, core: Any, task: types_pb2.Task) -> None:
        if not task.spec.model.name or not task.allocation.nodes:
            return
        na = task.allocation.nodes[0]
        hist = core.monitor.history(na.node_id)
        if hist is None or not na.gpu_indices:
            return
        started = next((h.time_unix_s for h in task.history if h.state == TaskState.RUNNING), 0.0)
        peak_mem, utils = 0.0, []
        for i in na.gpu_indices:
            times, mem = hist.series("mem_used_bytes", i)
            _, util = hist.series("util_gpu", i)
            window = times >= started
            if window.any():
                peak_mem = max(peak_mem, float(mem[window].max()))
                utils.append(float(util[window].mean()))
        if peak_mem > 0 and utils:
            self.profiler.observe(task.spec, int(peak_mem), sum(utils) / len(utils))

    async def _fail_or_requeue(self, core: Any, task: types_pb2.Task, reason: str) -> None:
        stored = await core.transition(task.id, TaskState.FAILED, reason, release=True)
        await self._maybe_restart(core, stored)

    async def _maybe_restart(self, core: Any, task: types_pb2.Task) -> None:
        states = _RESTART.get(task.spec.restart_policy, ())
        if TaskState(task.state) in states and task.restarts < (task.spec.max_restarts or 3):
            await core.transition(task.id, TaskState.PENDING, f"restart {task.restarts + 1} after failure",
                                  restarts=task.restarts + 1)
            self.wake()

    async def reconcile_after_grace(self, core: Any) -> None:
        """A new leader waits for agents to report; tasks nobody reports by then failed."""
        self._reported = {e.node_id: set() for e in core.registry if e.connected}
        await asyncio.sleep(self.cfg.task_grace_s)
        for task in list(core.tasks.values()):
            if task.state not in _ACTIVE or task.state == TaskState.SCHEDULED:
                continue
            nodes = [na.node_id for na in task.allocation.nodes]
            if any(task.id in self._reported.get(n, set()) for n in nodes):
                continue
            self._log.warning("task_unreported", task_id=task.id, nodes=",".join(nodes))
            try:
                await self._fail_or_requeue(core, task, f"no agent reported it within {self.cfg.task_grace_s:.0f}s "
                                            "after a leader change")
            except GptrmError as e:
                self._log.warning("task_reconcile_failed", task_id=task.id, reason=str(e))

    # ---- admin operations ---------------------------------------------------------------------

    async def cancel(self, core: Any, task_id: str) -> types_pb2.Task:
        task = core.get_task(task_id)
        if task.state in TERMINAL_STATES:
            raise IllegalTransition(f"task {task_id}: already {TaskState(task.state).label}")
        if task.state == TaskState.PENDING or not task.allocation.nodes:
            return await core.transition(task_id, TaskState.CANCELLED, "cancelled by an admin", release=True)
        sent = [self._send(core, na.node_id, agent_pb2.Decision(
            decision_id=f"stop-{task_id}-{uuid.uuid4().hex[:6]}",
            stop=agent_pb2.StopTask(task_id=task_id, grace_s=task.spec.stop_grace_s or 10.0,
                                    reason="cancelled by an admin"))) for na in task.allocation.nodes]
        if not any(sent) or task.state == TaskState.SCHEDULED:
            return await core.transition(task_id, TaskState.CANCELLED, "cancelled by an admin", release=True)
        task.reason = "cancelling: stop sent to the agent"
        return task

    async def _signal(self, core: Any, task_id: str, kind: str, allowed: TaskState) -> types_pb2.Task:
        task = core.get_task(task_id)
        if task.state != allowed:
            raise IllegalTransition(f"task {task_id}: cannot {kind} a {TaskState(task.state).label} task")
        for na in task.allocation.nodes:
            msg = agent_pb2.PauseTask(task_id=task_id) if kind == "pause" else agent_pb2.ResumeTask(task_id=task_id)
            if not self._send(core, na.node_id, agent_pb2.Decision(
                    decision_id=f"{kind}-{task_id}-{uuid.uuid4().hex[:6]}", **{kind: msg})):
                raise IllegalTransition(f"task {task_id}: node {na.node_id} is not connected")
        return task

    async def pause(self, core: Any, task_id: str) -> types_pb2.Task:
        return await self._signal(core, task_id, "pause", TaskState.RUNNING)

    async def resume(self, core: Any, task_id: str) -> types_pb2.Task:
        return await self._signal(core, task_id, "resume", TaskState.PAUSED)

    async def drain(self, core: Any, entry: NodeEntry) -> None:
        """Draining keeps running tasks to completion (as Slurm's drain); nothing new lands here."""
        self._log.info("node_draining", node_id=entry.node_id, tasks=len(entry.task_ids))

