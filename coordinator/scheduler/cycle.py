"""The scheduler cycle on the leader: snapshot → plan → commit → dispatch.

Every decision of a cycle comes from the scheduling pipeline's pure functions
(:mod:`coordinator.scheduler.pipeline`), which the simulator runs too; this module gathers their inputs from the
leader state, and carries out what they decide (etcd writes, agent streams, events, metrics). The clock is
injected (``clock``): a cycle reads it once and plans at that time.

One cycle, in this order (each step needs the previous one's output):

0. moves: tasks holding a GPU that turned unhealthy (fenced in its node's record) are stopped with their
   checkpoint signal and requeued, or, elastic, shrink off it (``coordinator/health/moves.py``);
1. gather: PENDING tasks the workflow rules let through (start times, dependencies, array limits:
   ``coordinator/scheduler/workflow.py``; a task whose dependency can never be met ends here) and the Preemptor
   does not hold back, as :class:`~coordinator.scheduler.pipeline.PendingTask` values (placement request with the
   profiler's expected run time, queue view, elastic range, target and curve, reservation membership); the
   snapshot (READY nodes with their reservations and free GPUs, taken once per cycle so every policy reads the
   same consistent view); the team queues' state and the GPUs each reservation keeps;
2. plan the placements (:func:`~coordinator.scheduler.pipeline.plan_placements`): queue order (priority, then
   slack — deadline − now − expected run time, no deadline last — then submit time), the queues' admission and
   fair order, elastic tasks at their first size, each reservation's own work on its kept GPUs, the production
   placement engine's batch (policy filter + rank, then the Resource Allocator's GPU choice; its state kept
   from cycle to cycle), elastic tasks placed smaller when refused and, when nothing was left waiting, sized
   into the idle GPUs left over; with team queues what an elastic task takes beyond its minimum comes out of
   its queue's room (:class:`~coordinator.queues.planning.QueueRoom`), and a task placed in another GPU pool
   than its queue admitted it in waits, its GPUs given back to the rest of the batch;
3. commit: placements go to etcd in batched, fenced transactions (task → SCHEDULED, allocation, node
   reservation, all or nothing per placement), with the room the agents count beyond resources (a task uid, a
   master port);
4. dispatch: only committed placements become StartTask decisions on the agents' streams; the others keep a
   human-readable reason (under max-utilization and load-balancing an unplaceable task also raises a scale-out
   request, the Resource Adaptor's; under power-efficient it simply waits);
5. plan the resizes on what was committed (:func:`~coordinator.scheduler.pipeline.plan_resizes`) and carry them
   out (``coordinator/elastic/allocator.py``): GPUs a reservation keeps given back ahead of its start, else running
   elastic tasks shrink (never below their minimum) for tasks left waiting or for a task their queue refused,
   or grow into idle GPUs of ready nodes when none waits. Why each elastic task does not grow is noted for
   ``gptrmctl tasks TASK``;
6. preempt and reclaim: when a task was left waiting (and no resize is under way) and strictly-lower-priority
   preemptible work holds what it needs, the QoS Manager (``coordinator/qos/preemption.py``) stops victims for
   it, chosen by :func:`~coordinator.qos.preemption.choose_candidates`; queues owed their quota take borrowed
   GPUs back (:func:`~coordinator.queues.planning.reclaim_for`). Pending tasks of lower priority than a
   preemptor still waiting for its victims are left out of step 1, so that they do not take what was freed
   for it; a queue that reclaimed has its tasks placed ahead of step 2's batch until a cycle ran with its
   borrowers stopped, so that what was reclaimed for it does not go back to a borrower first (a claim, kept
   in this leader's memory).

The resizes are planned after the commit, not with the placements, because what etcd refused must not count
as held by the queues; the simulator books its placements and then plans its resizes the same way.
"""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import NamedTuple

from common.errors import GptrmError
from common.logging import get_logger
from common.pb.gptrm.v1 import types_pb2
from common.types import TaskState
from coordinator.dispatch.dispatcher import Dispatcher
from coordinator.dispatch.launch import REFUSED_PORT_S, PortBook, node_address
from coordinator.domain import NodeSnapshot, Placement, Rejection, Request
from coordinator.elastic.rules import NO_CURVE, placement_gpus
from coordinator.events import EventBus
from coordinator.health.moves import GpuMoves
from coordinator.health.rules import health_notes
from coordinator.monitor.metrics import Metrics
from coordinator.monitor.nodes import NodeRegistry
from coordinator.ports import Elasticity, Preemption, ScaleOut
from coordinator.profiler import Profiler, run_key
from coordinator.queues import AdmissionDecision
from coordinator.queues.planning import LeaderQueues, QueuePlan, queue_of, queued
from coordinator.reservations import Kept, Reservations, state_of
from coordinator.scheduler.pipeline import (
    PendingTask,
    PlacementInputs,
    PlacementPlan,
    QueueState,
    RefusedTask,
    ResizeInputs,
    on_pool,
    plan_placements,
    plan_resizes,
    unsettled,
)
from coordinator.scheduler.placement.live import LivePlacement
from coordinator.scheduler.policy import PolicySetting, threshold_mode
from coordinator.scheduler.queue import request_for
from coordinator.scheduler.snapshot import SnapshotBuilder, takes_uid
from coordinator.scheduler.wakeup import Wakeup
from coordinator.scheduler.workflow import WorkflowGate
from coordinator.supervisor import Beat, no_beat
from coordinator.sync.leadership import Leadership
from coordinator.sync.store import PlacementCommit, Store
from coordinator.tasks import TaskTable

__all__ = ["FORCED_CYCLE_S", "PACE", "SchedulerCycle"]

FORCED_CYCLE_S = 30.0
"""A cycle runs at least this often even when nothing seems to have changed."""
PACE = 1.0
"""After a cycle that left tasks waiting, the next one waits this many times the cycle's own work
(:meth:`SchedulerCycle.run`)."""
_PERIOD_S = 1.0


class SchedulerCycle:
    """Places pending tasks while this replica leads.

    Example::

        placed = await cycle.cycle()      # one cycle: snapshot, place, commit, push
        await cycle.run()                 # while leading: a cycle per wake-up, at least once a second

    :param tasks: the task table.
    :param registry: the node table.
    :param snapshots: builds each cycle's snapshot.
    :param policy: the placement policy in force.
    :param store: the fenced etcd store (placement commits).
    :param leadership: fenced writes, the epoch and etcd health.
    :param dispatcher: StartTask decisions for committed placements.
    :param scale_out: the Resource Adaptor's scale-out requests.
    :param metrics: decision, cycle and commit latencies.
    :param events: the cluster event log.
    :param wakeup: what wakes a cycle early.
    :param preemptor: the QoS Manager's preemption, asked after a cycle left tasks waiting.
    :param profiler: expected run times (tasks with a deadline are ordered by slack within a priority).
    :param on_unplaced: told of every task a cycle could not place (the Resource Adaptor's wake-ups).
    :param gang_label: the node label whose shared value multi-node tasks prefer ("" none).
    :param queues: the team queues (admission, fair order across queues, reclaim); None: none.
    :param elastic: the elastic allocator (None: elastic tasks run at their minimum and never resize).
    :param on_shrunk: told ``(waiting task, GPUs)`` when elastic tasks shrink for a waiting task (the Resource
        Adaptor wakes a node for what they gave up).
    :param moves: moves work off fenced GPUs first thing in each cycle (None: never).
    :param will_restart: whether an ended task is about to be requeued (a dependency on it is still awaited).
    :param reservations: GPUs kept for a queue's or users' work (None: none).
    :param clock: unix seconds; every decision of a cycle is made at one reading of it.
    """

    def __init__(self, tasks: TaskTable, registry: NodeRegistry, snapshots: SnapshotBuilder, policy: PolicySetting,
                 store: Store, leadership: Leadership, dispatcher: Dispatcher, scale_out: ScaleOut,
                 metrics: Metrics, events: EventBus, wakeup: Wakeup, preemptor: Preemption, profiler: Profiler,
                 on_unplaced: Callable[[types_pb2.Task], None] = lambda task: None, gang_label: str = "",
                 queues: LeaderQueues | None = None, elastic: Elasticity | None = None,
                 on_shrunk: Callable[[str, int], None] = lambda task_id, gpus: None,
                 moves: GpuMoves | None = None,
                 will_restart: Callable[[types_pb2.Task], bool] = lambda task: False,
                 reservations: Reservations | None = None, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._moves = moves
        self._preemptor, self._profiler = preemptor, profiler
        self._gate = WorkflowGate(tasks.find, tasks.array_elements, will_restart)
        self._reservations = reservations
        self._elastic, self._on_shrunk = elastic, on_shrunk
        self._queues = queues
        self._gang_label = gang_label
        self._on_unplaced = on_unplaced
        self._tasks, self._registry, self._snapshots, self._policy = tasks, registry, snapshots, policy
        self._placement = LivePlacement()
        self._store, self._leadership, self._dispatcher = store, leadership, dispatcher
        self._scale_out, self._metrics, self._events, self._wakeup = scale_out, metrics, events, wakeup
        self._log = get_logger("scheduler")
        self.cycles = 0
        self.skipped = 0                                # cycles skipped: nothing changed since all waited
        self._waited_s = 0.0                            # this cycle's time waiting for its commit (run() paces)
        self._left_waiting = 0                          # tasks this cycle could not place
        self._pause: Callable[[float], Awaitable[None]] = asyncio.sleep   # run()'s pause between cycles
        self._uid_full = 0                              # nodes of this cycle's snapshot without a free task uid
        # What this cycle adds to every rejection's reason (nodes without a free task uid, fenced GPUs and
        # health-held nodes), built at its first rejection.
        self._also: str | None = None
        self._idle: tuple[tuple, float] | None = None   # (inputs, time) of the last cycle that placed nothing
        # Queue → the borrowers it reclaimed GPUs from: its tasks go ahead in each cycle's batch until one ran with
        # those GPUs free (a reclaim's claim; :class:`~coordinator.scheduler.pipeline.PlacementInputs`). Kept in
        # this leader's memory: a new leader starts without claims.
        self._claims: dict[str, set[str]] = {}
        # The last cycle's pending tasks as the plan saw them, with what each view was built from (:meth:`_pending`).
        self._requests: dict[str, _Viewed] = {}

    async def run(self, beat: Beat = no_beat) -> None:
        """Schedule while leading; a cycle runs on every wake-up and at least once a second.

        After a cycle that left tasks waiting for room, the next one waits ``PACE`` times the time the cycle kept
        the leader's loop busy (its own work, not its waits for etcd): what waits can only run once tasks end, and
        ends come one by one. A cycle looks at every waiting task, so with thousands waiting (a sweep submitted
        faster than the cluster runs it) back-to-back cycles, each placing what one end freed, would take the
        whole loop and slow the submits and ends they wait for; spaced out, each places what several ends freed.
        A cycle that placed everything it looked at is followed at the next wake-up, without a pause."""
        while True:
            await self._wakeup.wait(_PERIOD_S)
            if not self._leadership.stale:
                started = time.perf_counter()
                self._waited_s, self._left_waiting = 0.0, 0
                try:
                    await self.cycle()
                except GptrmError as e:
                    self._log.warning("schedule_cycle_failed", reason=str(e))
                busy = time.perf_counter() - started - self._waited_s
                if self._left_waiting and busy > 0:
                    await self._pause(min(_PERIOD_S, PACE * busy))
            beat()

    def _inputs(self, now: float) -> tuple:
        """Everything a cycle's decisions depend on, cheaply: the policy, the count of stored task changes the
        leader followed (a submit, a state change, a placement, a release, an end: demands, allocations and thus
        per-GPU use follow from them; a reason noted in memory is no change) and every node's state, admin flags,
        stream (inventory), reservations, the room its agent reports (task uids, free ports), its fenced GPUs and
        whether its health check is pending.
        Power curves and DEGRADED GPUs only rank, so they are left out."""
        policy = self._policy.current
        tasks = self._tasks.changes
        nodes = []
        for e in self._registry:
            r = e.reservation.used
            nodes.append((e.node_id, e.state, e.stream_id, e.record.cordoned, e.record.draining, e.record.power_state,
                          r.gpus, r.gpu_mem_total_bytes, r.cpu_cores, r.mem_bytes, r.disk_bytes, e.task_uid_room,
                          e.task_ports_free, e.health_pending, tuple([f.gpu_index for f in e.record.gpu_fences])))
        queues = (self._queues.config, tuple(sorted(self._queues.budgets.items()))) if self._queues else None
        # Elastic tasks whose hysteresis has run out may now shrink for what waits.
        settled = self._elastic_settled(now)
        kept = tuple((k.reservation.name, state_of(k.reservation, now), k.gpus)
                     for k in (self._reservations.kept() if self._reservations is not None else ()))
        return policy.name, policy.threshold, policy.threshold_mode, tasks, tuple(nodes), queues, settled, kept

    async def cycle(self) -> int:
        """One scheduling cycle; returns the number of placements committed.

        snapshot → plan → commit → dispatch: the inputs are gathered from the leader state, the placements decided
        by :func:`~coordinator.scheduler.pipeline.plan_placements`, committed (fenced) and pushed; then the resizes
        decided by :func:`~coordinator.scheduler.pipeline.plan_resizes` on what was committed are carried out, and
        the Preemptor and the queues' reclaim look at what is left waiting.

        When the last cycle placed nothing and none of its inputs changed since (:meth:`_inputs`),
        it would refuse the same tasks for the same reasons, so it is skipped — apart from one
        cycle every ``FORCED_CYCLE_S`` as a safety net. Waiting tasks then cost a comparison per
        second instead of a cluster snapshot and a placement batch.
        """
        started = time.perf_counter()
        if self._moves is not None:
            await self._moves.step()   # before anything is placed: what it stops is on its way back to the queue
        now = self._clock()   # restart backoff: a requeued task waits until its not_before time
        if self._elastic is not None:
            self._elastic.observe()   # every cycle: the curves learn while the tasks run
        pending = self._preemptor.schedulable(await self._gated(self._due(now), now))
        if not pending:
            self._idle = None
            if self._elastic is not None and self._elastic_settled(now, grow=True):
                snapshot = self._snapshots.snapshot(self._tasks.live(), self._registry, stored=True)
                await self._elastic_step(now, [], snapshot.nodes)
            elif self._elastic is not None:
                interval = self._elastic.settings.interval_s
                self._elastic.note_blocked({j.task_id: unsettled(j, now, interval) for j in self._elastic.jobs()})
            return 0
        inputs = (self._inputs(now), tuple(t.id for t in pending))
        if self._idle is not None and self._idle[0] == inputs and started - self._idle[1] < FORCED_CYCLE_S:
            self.skipped += 1
            return 0
        self._idle = None
        by_id = {t.id: t for t in pending}
        policy = self._policy.current
        mode = threshold_mode(policy)
        queues = self._queues if self._queues is not None and self._queues.config.managed else None
        if queues is not None:
            queues.accrue()
        kept = self._reservations.kept() if self._reservations is not None else []
        snapshot = self._snapshots.snapshot(self._tasks.live(), self._registry, stored=True)
        plan = plan_placements(PlacementInputs(
            now=now, pending=self._pending(pending, queues is not None, kept),
            # The placement state is kept from cycle to cycle; only nodes whose snapshot changed are applied.
            engine_for=lambda snap: self._placement.engine(snap if snap is not None else snapshot, policy.name,
                                                           threshold=policy.threshold, mode=mode,
                                                           gang_label=self._gang_label),
            snapshot=snapshot,
            queues=self._queue_state(pending) if queues is not None else None, kept=kept, policy=policy.name,
            threshold=policy.threshold, mode=mode,
            claims=frozenset(self._claims) if queues is not None else frozenset()))
        self._claims_served()
        qplan = plan.queues
        if qplan is not None:
            for task_id, reason in qplan.refused.items():
                self._tasks.note_reason(task_id, reason)
            self._metrics.decisions.labels(outcome="waiting").inc(len(qplan.refused))
        self._metrics.decision_latency.observe((time.perf_counter() - started) / max(1, len(plan.requests)))
        commits, committed = await self._dispatch(plan, by_id, policy.name, now)
        rejected = [by_id[d.task_id] for d in plan.decisions if not isinstance(d, Placement)]
        self._left_waiting = len(rejected)
        resized = False
        if self._elastic is not None and self._elastic.jobs():   # (no running elastic task: nothing to resize)
            nodes = [plan.engine.node_snapshot(i) for i in range(len(plan.engine.state.nodes))]
            refused = [(by_id[t], why) for t, why in qplan.refused.items() if t in by_id] if qplan is not None else []
            resized = await self._elastic_step(now, plan.waiting(), nodes, refused)
        # A shrink makes room for what waits more cheaply than a preemption: none this cycle.
        preempted = resized or (bool(rejected) and await self._preemptor.after_rejections(
            rejected, policy.name, policy.threshold, mode))
        if qplan is not None and await self._reclaim(qplan, {c[0].id for c in commits}, by_id):
            preempted = True
        self._metrics.sched_latency.observe(time.perf_counter() - started)
        self.cycles += 1
        if not commits and not preempted:
            self._idle = (inputs, started)
        return committed

    def _pending(self, pending: Sequence[types_pb2.Task], queued_too: bool, kept: Sequence[Kept]) -> list[PendingTask]:
        """The cycle's pending tasks as the plan sees them: placement request (with the profiler's expected run time;
        without one, the task's time limit: it ends by then at the latest), queue view, elastic range, target and
        curve, and the active reservation each is the own work of.

        A rigid task's view is kept from cycle to cycle while its record and expected run time are the same (a
        record is replaced, never changed in place) and no reservation is active: a queue of thousands waiting
        then costs a lookup per task, not a request built anew."""
        out = []
        cache: dict[str, _Viewed] = {}
        last_cycle = self._requests
        for t in pending:
            last = last_cycle.get(t.id)
            if last is not None and last.task is not t:
                last = None   # a new record: nothing of the last view is reused
            key, limit = (last.key, last.limit) if last is not None else (run_key(t.spec), t.spec.time_limit_s)
            run_s = self._profiler.expected_run_s_of(key) or limit or None
            if last is not None and last.run_s == run_s and last.queued_too == queued_too and not kept \
                    and last.view.elastic is None and last.view.reservation < 0:
                view = last.view
            else:
                request = last.view.request if last is not None and last.run_s == run_s else request_for(t, run_s)
                rng = self._elastic.range(t) if self._elastic is not None else None
                member = self._reservations.active_member_of(t, kept) \
                    if self._reservations is not None and kept else None
                view = PendingTask(
                    request, queued(t) if queued_too else None, rng,
                    t.elastic.target_gpus if rng is not None else 0,
                    self._elastic.curve(t) if rng is not None and self._elastic is not None else NO_CURVE,
                    next((i for i, k in enumerate(kept) if k is member), -1) if member is not None else -1)
            cache[t.id] = _Viewed(t, key, limit, run_s, queued_too, view)
            out.append(view)
        self._requests = cache
        return out

    def _queue_state(self, pending: Sequence[types_pb2.Task]) -> QueueState:
        """The team queues as this cycle plans them."""
        assert self._queues is not None
        held, stopping = self._queues.holdings()
        return QueueState(self._queues.config, held + stopping, self._queues.capacity(), self._queues.decay,
                          self._queues.gates([queued(t) for t in pending]), now=self._queues.clock())

    async def _dispatch(self, plan: PlacementPlan, by_id: dict[str, types_pb2.Task], policy: str,
                        now: float) -> tuple[list[PlacementCommit], int]:
        """Commit the plan's placements (fenced, batched) and push the committed ones to their agents; note why each
        rejected task waits. Returns the commits tried and how many were committed."""
        commits: list[PlacementCommit] = []
        # Only a multi-node placement takes a master port: the book (a walk over the unfinished tasks) is built then.
        ports = functools.cache(lambda: PortBook.of(self._tasks.live(), refused=self._refused_ports()))
        uid_room = dict(self._snapshots.uid_room)
        self._uid_full = sum(1 for left in uid_room.values() if left <= 0)
        self._also = None   # built at this cycle's first rejection
        qplan = plan.queues
        for decision in plan.decisions:
            task = by_id[decision.task_id]
            if isinstance(decision, Placement):
                if qplan is not None:
                    task = self._borrowing(task, decision, qplan.admissions[task.id], plan.beyond.get(task.id, 0))
                roomy = self._with_room(task, decision, uid_room, ports)
                if roomy is None:
                    continue
                decision, port = roomy
                if task.id in plan.ranges:
                    task = _sized(task, decision)
                commits.append((task, task.revision, self._allocation(task, decision, port, now)))
            else:
                self._note_rejection(task, decision, policy)
        self._metrics.decisions.labels(outcome="placed").inc(len(commits))
        self._metrics.decisions.labels(outcome="waiting").inc(len(plan.decisions) - len(commits))
        if not commits:
            return commits, 0
        at = time.perf_counter()
        try:
            return commits, await self._commit(commits)
        finally:
            self._waited_s += time.perf_counter() - at

    def startable(self, by_unix_s: float) -> list[types_pb2.Task]:
        """The pending tasks a cycle at ``by_unix_s`` could place as far as the workflow rules go (start time,
        dependencies, array limit; a requeued task's backoff), whether or not there is room: what the power
        manager counts as waiting work. Reads only; a cycle notes the reasons of the others."""
        return self._gate.sort(self._due(by_unix_s), by_unix_s).ready

    def _due(self, at_unix_s: float) -> list[types_pb2.Task]:
        """The pending tasks whose restart backoff (``not_before_unix_s``) is over at ``at_unix_s``."""
        return [t for t in self._tasks.pending() if t.not_before_unix_s <= at_unix_s]

    async def _gated(self, pending: list[types_pb2.Task], now: float) -> list[types_pb2.Task]:
        """The pending tasks the workflow rules let this cycle place (start times, dependencies, array limits:
        ``coordinator/scheduler/workflow.py``); the others get their pending reason, and a task whose dependency
        can never be met ends CANCELLED with that reason."""
        gated = self._gate.sort(pending, now)
        for task_id, reason in gated.held.items():
            self._tasks.note_reason(task_id, reason)
        by_reason: dict[str, list[types_pb2.Task]] = {}
        for task, reason in gated.unmet:
            by_reason.setdefault(reason, []).append(task)
        for reason, unmet in by_reason.items():   # many at once when a whole array waited for one task
            try:
                for task in await self._tasks.cancel_unplaced(unmet, reason):
                    self._events.publish("task_state", f"task {task.id} pending → cancelled: {reason}",
                                         task_id=task.id, state="cancelled")
                    self._log.info("task_dependency_unmet", task_id=task.id, reason=reason)
            except GptrmError as e:   # etcd refused: the next cycle looks again
                self._log.warning("task_dependency_end_failed", count=len(unmet), error=str(e))
        return gated.ready
    def _elastic_settled(self, now: float, *, grow: bool = False) -> int:
        """Running elastic tasks whose hysteresis allows a resize now (``grow``: and below their maximum)."""
        if self._elastic is None:
            return 0
        interval = self._elastic.settings.interval_s
        return sum(1 for j in self._elastic.jobs()
                   if j.settled(now, interval) and (not grow or j.size < j.range.maximum))

    async def _elastic_step(self, now: float, waiting: Sequence[Request], nodes: Sequence[NodeSnapshot],
                            refused: Sequence[tuple[types_pb2.Task, str]] = ()) -> bool:
        """Resize running elastic tasks as :func:`~coordinator.scheduler.pipeline.plan_resizes` decides over what
        this cycle committed; True when a resize is under way. Why each task that could be bigger does not grow is
        noted with the allocator (``gptrmctl tasks TASK``)."""
        assert self._elastic is not None
        jobs = self._elastic.jobs()
        if not jobs:
            return False
        queues = self._queues if self._queues is not None and self._queues.config.managed else None
        keys: dict[str, tuple[str, str]] = {}
        requests: dict[str, Request] = {}
        for j in jobs:
            task = self._tasks.find(j.task_id)
            if task is None:
                continue
            key = (queue_of(task), queues.pool_of_task(task)) if queues is not None else None
            if key is not None:
                keys[j.task_id] = key
            req = request_for(task)
            requests[j.task_id] = on_pool(req, key[1]) if key is not None else req
        stopping: frozenset[str] = frozenset()   # queues with an elastic task still stopping for a resize
        if refused and queues is not None:
            stopping = frozenset(queue_of(t) for t in self._tasks.live()
                                 if t.state == TaskState.PREEMPTED and t.spec.HasField("elastic"))
        kept = self._reservations.kept() if self._reservations is not None else []
        plan = plan_resizes(ResizeInputs(
            now=now, settings=self._elastic.settings, jobs=jobs, nodes=nodes, waiting=waiting, requests=requests,
            refused=[RefusedTask(queued(t), t.spec.priority, why) for t, why in refused] if queues is not None else (),
            queue_pools=keys,
            queues=(queues.config, queues.use(), queues.capacity()) if queues is not None else None,
            stopping=stopping, kept=kept, tasks=self._tasks.view() if kept else {}))
        decisions = plan.resizes
        self._elastic.note_blocked(plan.blocked)
        done = set(await self._elastic.resize(decisions)) if decisions else set()
        gave: dict[str, int] = {}
        for d in decisions:
            if d.task_id in done and d.for_task:
                gave[d.for_task] = gave.get(d.for_task, 0) + d.from_gpus - d.to_gpus
        for task_id, gpus in sorted(gave.items()):
            self._on_shrunk(task_id, gpus)
        return bool(done)

    def _borrowing(self, task: types_pb2.Task, placement: Placement, admission: AdmissionDecision,
                   beyond: int = 0) -> types_pb2.Task:
        """The task as it is committed: with the GPUs its queue borrows for it (its admission's, plus ``beyond``:
        what an elastic task borrows above its minimum; a copy: the record in the leader state changes only when
        etcd stored the placement). The plan placed it in the GPU pool its queue admitted it in."""
        borrowed = min(admission.borrowed + beyond, placement_gpus(placement) or admission.borrowed + beyond)
        if borrowed == task.borrowed_gpus:
            return task
        marked = types_pb2.Task()     # set afresh: a requeued task may have borrowed in its last run
        marked.CopyFrom(task)
        marked.borrowed_gpus = borrowed
        return marked

    async def _reclaim(self, plan: QueuePlan, placed: set[str], by_id: dict[str, types_pb2.Task]) -> bool:
        """Queues owed GPUs within their quota take them back from borrowers (one victim set per queue)."""
        assert self._queues is not None
        waiting = [by_id[t] for t in (*plan.order, *plan.refused) if t not in placed and t in by_id]
        victims = self._queues.reclaim(waiting)
        if not victims:
            return False
        for_queue: dict[str, list[types_pb2.Task]] = {}
        for v in victims:
            task = self._tasks.find(v.task_id)
            if task is not None:
                for_queue.setdefault(v.for_queue, []).append(task)
        stopped = []
        for queue, tasks in sorted(for_queue.items()):
            ids = await self._preemptor.reclaim(tasks, queue)
            if ids:
                self._claims.setdefault(queue, set()).update(ids)
                stopped += ids
        return bool(stopped)

    def _claims_served(self) -> None:
        """Drop the reclaim claims whose borrowers had all stopped when this cycle planned: its batch placed the
        queue's tasks ahead, on the GPUs given back."""
        for queue, ids in list(self._claims.items()):
            if not any((t := self._tasks.find(i)) is not None and t.state == TaskState.PREEMPTED for i in ids):
                del self._claims[queue]

    def _refused_ports(self) -> dict[str, set[int]]:
        """Per node, the master ports a start found held by something else in the last
        :data:`~coordinator.dispatch.launch.REFUSED_PORT_S` seconds (older ones forgotten)."""
        now = time.monotonic()
        refused: dict[str, set[int]] = {}
        for e in self._registry:
            if e.ports_refused:
                for port, at in list(e.ports_refused.items()):
                    if now - at > REFUSED_PORT_S:
                        del e.ports_refused[port]
                refused[e.node_id] = set(e.ports_refused)
        return refused

    def _with_room(self, task: types_pb2.Task, placement: Placement, uid_room: dict[str, int],
                   ports: Callable[[], PortBook]) -> tuple[Placement, int] | None:
        """The placement as committed, with the room its agents count beyond resources (``agent/room.py``):
        a task uid on every node (``uid_room``: what each node can still take this cycle, taken here) and,
        for a multi-node task, a master port on rank 0 (the first node of the placement whose agent reports
        a free port of its range, made rank 0; the port taken from the book ``ports()`` builds). None, with the
        task's reason noted, when a node lacks either: it waits for the next cycle, where a node without a free uid
        is unschedulable."""
        nodes = placement.node_ids
        if takes_uid(task):
            full = [n for n in nodes if uid_room.get(n, 1) <= 0]
            if full:
                self._tasks.note_reason(task.id, f"waiting for a task uid: node {full[0]} has none free (every uid "
                                                 "of its agent's --task-uids is in use)")
                return None
        port = 0
        if len(placement.assignments) > 1:
            book = ports()
            for k, a in enumerate(placement.assignments):
                entry = self._registry.get(a.node_id)
                if entry is None:
                    continue
                free = entry.task_ports_free
                if free is not None and free <= book.taken_here(a.node_id):
                    continue
                port = book.take(a.node_id, entry.inventory.task_port_min, entry.inventory.task_port_max)
                if port:
                    if k:   # rank 0 is the first node of the allocation
                        rest = placement.assignments[:k] + placement.assignments[k + 1:]
                        placement = replace(placement, assignments=(a, *rest))
                    break
            if not port:
                self._log.warning("master_port_unavailable", task_id=task.id, nodes=",".join(nodes))
                self._tasks.note_reason(task.id, "waiting for a master port: no node chosen for it has a free port "
                                                 "of its --task-port-range")
                return None
        if takes_uid(task):
            for n in nodes:
                if n in uid_room:
                    uid_room[n] -= 1
        return placement, port

    def _allocation(self, task: types_pb2.Task, placement: Placement, port: int, now: float) -> types_pb2.Allocation:
        """The allocation of a placement: nodes in rank order with their addresses, and for a multi-node task
        the master port reserved on the rank-0 node (see :mod:`coordinator.dispatch.launch`)."""
        alloc = types_pb2.Allocation(task_id=task.id, leader_epoch=self._leadership.epoch,
                                     decision_id=f"d-{uuid.uuid4().hex[:12]}", created_unix_s=now)
        d = task.demand
        for a in placement.assignments:
            entry = self._registry.get(a.node_id)
            uuids = {g.index: g.uuid for g in entry.inventory.gpus} if entry else {}
            n = len(a.gpu_indices)
            # An elastic task holds the GPUs of its placement, whatever its spec's size (its minimum): the node's
            # reservation, and so the next snapshot's used GPUs, count what it really holds.
            gpus = float(n) if task.spec.HasField("elastic") and n else d.gpus
            alloc.nodes.append(types_pb2.NodeAllocation(
                node_id=a.node_id, gpu_indices=list(a.gpu_indices), gpu_uuids=[uuids.get(i, "") for i in a.gpu_indices],
                gpu_share=a.gpu_share, address=node_address(entry.inventory) if entry else a.node_id,
                # On the node, GPU memory is the total of its GPUs (Task.demand holds it per GPU).
                demand=types_pb2.ResourceVector(gpus=gpus, gpu_mem_bytes=d.gpu_mem_bytes * max(n, 1),
                                                cpu_cores=d.cpu_cores, mem_bytes=d.mem_bytes,
                                                disk_bytes=d.disk_bytes)))
        alloc.master_port = port
        return alloc

    async def _commit(self, commits: list[PlacementCommit]) -> int:
        t0 = time.perf_counter()
        # Checked against what nodes hold (no GPU booked twice: coordinator/sync/_placements.py).
        held = self._registry.holdings.reservation_on
        result = await self._leadership.write(self._store.commit_placements, commits, held)
        self._metrics.commit_latency.observe(time.perf_counter() - t0)
        policy = self._policy.current.name
        for task, _rev, alloc in commits:
            if task.id not in result.committed:
                self._log.info("placement_not_committed", task_id=task.id, reason=str(result.rejected.get(task.id)))
                await self._tasks.refresh(task.id)
                continue
            stored = result.stored[task.id]
            self._tasks.placed(stored)
            self._scale_out.forget(task.id)
            nodes = ", ".join(f"{na.node_id}:{list(na.gpu_indices)}" for na in alloc.nodes)
            self._log.info("placement_committed", task_id=task.id, policy=policy, nodes=nodes,
                           decision_id=alloc.decision_id)
            self._events.publish("decision", f"task {task.id} placed on {nodes}", task_id=task.id,
                                 policy=policy, decision_id=alloc.decision_id)
            self._dispatcher.start(stored)
        for stored in result.recovered.values():   # an earlier commit's answer was lost, and it did commit
            self._tasks.placed(stored)
            self._dispatcher.start(stored)
        return len(result.committed)

    def _note_rejection(self, task: types_pb2.Task, rejection: Rejection, policy: str) -> None:
        if self._also is None:
            also = []
            if self._uid_full:
                also.append(f"{self._uid_full} node(s) have no free task uid (every uid of their agent's "
                            "--task-uids is in use)")
            held = [e for e in self._registry if e.health_pending or e.record.health_drained or e.record.gpu_fences]
            also.extend(health_notes((e.node_id, e.record, e.health_pending)
                                     for e in sorted(held, key=lambda e: e.node_id)))
            self._also = "".join(f"; {note}" for note in also)
        reason = rejection.reason + self._also
        if reason != task.reason:
            self._tasks.note_reason(task.id, reason)   # shown by `gptrmctl tasks`
        if rejection.scale_out:
            self._scale_out.request(task.id, rejection.reason, policy=policy)
        self._on_unplaced(task)


class _Viewed(NamedTuple):
    """A pending task's view in the last cycle, and what it was built from (:meth:`SchedulerCycle._pending`)."""

    task: types_pb2.Task   # the record (replaced, never changed in place: the same object is the same record)
    key: str               # its profiler run key
    limit: float           # its time limit (0: none)
    run_s: float | None    # the expected run time its request carries
    queued_too: bool       # whether its queue view was built
    view: PendingTask


def _sized(task: types_pb2.Task, placement: Placement) -> types_pb2.Task:
    """An elastic task as it is committed: with the GPUs of its placement (a copy)."""
    sized = types_pb2.Task()
    sized.CopyFrom(task)
    sized.elastic.gpus = placement_gpus(placement)
    return sized

