"""The scheduler cycle on the leader: queue → snapshot → policy → allocator → etcd → agents.

One cycle, in this order (each step needs the previous one's output):

0. moves: tasks holding a GPU that turned unhealthy (fenced in its node's record) are stopped with their
   checkpoint signal and requeued, or, elastic, shrink off it (``coordinator/health/moves.py``);
1. queue: PENDING tasks the workflow rules let through (start times, dependencies, array limits:
   ``coordinator/scheduler/workflow.py``; a task whose dependency can never be met ends here), ordered
   by priority, then slack (deadline − now − the profiler's expected run time, 0 when it has none; no
   deadline last), then submit time;
2. snapshot: READY nodes with their reservations and free GPUs, taken once per cycle so
   every policy reads the same consistent view;
3. placement: the production engine (policy filter + rank, then the Resource Allocator's
   GPU choice) decides the whole batch;
4. commit: placements go to etcd in batched, fenced transactions (task → SCHEDULED,
   allocation, node reservation, all or nothing per placement);
5. push: only committed placements become StartTask decisions on the agents' streams;
6. elastic: running elastic tasks shrink (never below their minimum) for tasks left waiting, or grow
   into idle GPUs of ready nodes when none waits — on their own node, else on another one their
   constraints allow (:mod:`coordinator.elastic.rules`, carried out by ``coordinator/elastic/allocator.py``);
   pending elastic tasks are placed at their first size in step 3 and, when nothing was left waiting, take
   the idle GPUs left over before the commit. With team queues, whatever an elastic task takes beyond its
   minimum comes out of its queue's room (idle quota, then borrowed GPUs, within the queue's limits:
   :class:`~coordinator.queues.planning.QueueRoom`), and a task its queue refused (its limit, or what
   it may borrow) gets GPUs given back by the queue's running elastic tasks when that lets it in. Why each
   elastic task does not grow is noted for ``gptrmctl tasks TASK``;
7. preempt: when a task was left waiting and strictly-lower-priority preemptible work holds
   what it needs, the QoS Manager (``coordinator/qos/preemption.py``) stops victims for it.
   Pending tasks of lower priority than a preemptor still waiting for its victims are left out
   of step 1, so that they do not take what was freed for it.

Tasks that do not fit keep a human-readable reason; under max-utilization and
load-balancing an unplaceable task also raises a scale-out request (the Resource Adaptor's),
under power-efficient it simply waits.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace

from common.errors import GptrmError
from common.logging import get_logger
from common.pb.gptrm.v1 import types_pb2
from common.types import TaskState
from coordinator.dispatch.dispatcher import Dispatcher
from coordinator.dispatch.launch import REFUSED_PORT_S, PortBook, node_address
from coordinator.domain import ClusterSnapshot, Decision, NodeSnapshot, Placement, Rejection, Request, Resources
from coordinator.elastic.rules import (
    ElasticJob,
    ElasticRange,
    ElasticSettings,
    Resize,
    SpeedupCurve,
    first_size,
    idle_gpus,
    node_accepts,
    place_down,
    placement_gpus,
    plan_give_back,
    plan_grows,
    plan_shrinks,
    request_at,
    size_placements,
)
from coordinator.events import EventBus
from coordinator.health.moves import GpuMoves
from coordinator.health.rules import health_notes
from coordinator.monitor.metrics import Metrics
from coordinator.monitor.nodes import NodeRegistry
from coordinator.ports import Elasticity, Preemption, ScaleOut
from coordinator.profiler import Profiler
from coordinator.queues import ANY_MODEL, AdmissionDecision, Demand, admit
from coordinator.queues.planning import LeaderQueues, QueuePlan, QueueRoom, queue_of, queued, shrink_needed
from coordinator.reservations import Reservations, blocked, keep_only, shrinks_off, state_of
from coordinator.scheduler.placement import PlacementEngine
from coordinator.scheduler.placement.live import LivePlacement
from coordinator.scheduler.policy import PolicySetting, threshold_mode
from coordinator.scheduler.queue import request_for, slack_key
from coordinator.scheduler.snapshot import SnapshotBuilder, takes_uid
from coordinator.scheduler.wakeup import Wakeup
from coordinator.scheduler.workflow import WorkflowGate
from coordinator.supervisor import Beat, no_beat
from coordinator.sync.leadership import Leadership
from coordinator.sync.store import PlacementCommit, Store
from coordinator.tasks import TaskTable

__all__ = ["FORCED_CYCLE_S", "SchedulerCycle", "on_pool"]

FORCED_CYCLE_S = 30.0
"""A cycle runs at least this often even when nothing seems to have changed."""
RESERVATION_LEAD_S = 120.0
"""Elastic tasks holding GPUs a reservation keeps (not its own work) give them back this long before its start."""
_PERIOD_S = 1.0


def on_pool(request: Request, pool: str) -> Request:
    """A request held to the GPU pool its queue admitted it in (a pool a queue names is one GPU model)."""
    if pool == ANY_MODEL or request.gpu_model:
        return request
    return replace(request, gpu_model=pool)


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
    """

    def __init__(self, tasks: TaskTable, registry: NodeRegistry, snapshots: SnapshotBuilder, policy: PolicySetting,
                 store: Store, leadership: Leadership, dispatcher: Dispatcher, scale_out: ScaleOut,
                 metrics: Metrics, events: EventBus, wakeup: Wakeup, preemptor: Preemption, profiler: Profiler,
                 on_unplaced: Callable[[types_pb2.Task], None] = lambda task: None, gang_label: str = "",
                 queues: LeaderQueues | None = None, elastic: Elasticity | None = None,
                 on_shrunk: Callable[[str, int], None] = lambda task_id, gpus: None,
                 moves: GpuMoves | None = None,
                 will_restart: Callable[[types_pb2.Task], bool] = lambda task: False,
                 reservations: Reservations | None = None) -> None:
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
        self._uid_full = 0                              # nodes of this cycle's snapshot without a free task uid
        self._health: str | None = None                 # this cycle's fenced GPUs and health-held nodes, in words
        self._idle: tuple[tuple, float] | None = None   # (inputs, time) of the last cycle that placed nothing

    async def run(self, beat: Beat = no_beat) -> None:
        """Schedule while leading; a cycle runs on every wake-up and at least once a second."""
        while True:
            await self._wakeup.wait(_PERIOD_S)
            if not self._leadership.stale:
                try:
                    await self.cycle()
                except GptrmError as e:
                    self._log.warning("schedule_cycle_failed", reason=str(e))
            beat()

    def _inputs(self) -> tuple:
        """Everything a cycle's decisions depend on, cheaply: the policy, every unfinished task's state
        and revision (demands, allocations and thus per-GPU use follow from them; a task that ends
        leaves the set) and every node's state, admin flags, stream (inventory), reservations, the room
        its agent reports (task uids, free ports), its fenced GPUs and whether its health check is pending.
        Power curves and DEGRADED GPUs only rank, so they are left out."""
        policy = self._policy.current
        tasks = tuple((t.id, t.state, t.revision) for t in self._tasks.live())
        nodes = []
        for e in self._registry:
            r = e.reservation.used
            nodes.append((e.node_id, e.state, e.stream_id, e.record.cordoned, e.record.draining, e.record.power_state,
                          r.gpus, r.gpu_mem_total_bytes, r.cpu_cores, r.mem_bytes, r.disk_bytes, e.task_uid_room,
                          e.task_ports_free, e.health_pending, tuple([f.gpu_index for f in e.record.gpu_fences])))
        queues = (self._queues.config, tuple(sorted(self._queues.budgets.items()))) if self._queues else None
        # Elastic tasks whose hysteresis has run out may now shrink for what waits.
        settled = self._elastic_settled()
        now = time.time()
        kept = tuple((k.reservation.name, state_of(k.reservation, now), k.gpus)
                     for k in (self._reservations.kept() if self._reservations is not None else ()))
        return policy.name, policy.threshold, policy.threshold_mode, tasks, tuple(nodes), queues, settled, kept

    async def cycle(self) -> int:
        """One scheduling cycle; returns the number of placements committed.

        When the last cycle placed nothing and none of its inputs changed since (:meth:`_inputs`),
        it would refuse the same tasks for the same reasons, so it is skipped — apart from one
        cycle every ``FORCED_CYCLE_S`` as a safety net. Waiting tasks then cost a comparison per
        second instead of a cluster snapshot and a placement batch.
        """
        started = time.perf_counter()
        if self._moves is not None:
            await self._moves.step()   # before anything is placed: what it stops is on its way back to the queue
        now = time.time()   # restart backoff: a requeued task waits until its not_before time
        if self._elastic is not None:
            self._elastic.observe()   # every cycle: the curves learn while the tasks run
        pending = self._preemptor.schedulable(await self._gated(
            [t for t in self._tasks.live() if t.state == TaskState.PENDING and t.not_before_unix_s <= now], now))
        if not pending:
            self._idle = None
            if self._elastic is not None and self._elastic_settled(grow=True):
                await self._elastic_step([], self._snapshots.snapshot(self._tasks.live(), self._registry).nodes)
            elif self._elastic is not None:
                self._elastic.note_blocked({j.task_id: self._unsettled(j) for j in self._elastic.jobs()})
            return 0
        inputs = (self._inputs(), tuple(t.id for t in pending))
        if self._idle is not None and self._idle[0] == inputs and started - self._idle[1] < FORCED_CYCLE_S:
            self.skipped += 1
            return 0
        self._idle = None
        # The profiler's expected run time; without one, the task's time limit (it ends by then at the latest).
        runs = {t.id: run_s for t in pending
                if (run_s := self._profiler.expected_run_s(t.spec) or t.spec.time_limit_s or None) is not None}
        expected = {t.id: runs[t.id] for t in pending if t.spec.qos.deadline_unix_s and t.id in runs}
        requests = sorted((request_for(t, runs.get(t.id)) for t in pending), key=slack_key(time.time(), expected))
        by_id = {t.id: t for t in pending}
        plan = None
        if self._queues is not None and self._queues.config.managed:
            self._queues.accrue()
            plan = self._queues.plan([by_id[r.task_id] for r in requests])
            for task_id, reason in plan.refused.items():
                self._metrics.decisions.labels(outcome="waiting").inc()
                self._tasks.note_reason(task_id, reason)
            by_request = {r.task_id: r for r in requests}
            requests = [on_pool(by_request[task_id], plan.admissions[task_id].pool) for task_id in plan.order]
        ranges: dict[str, ElasticRange] = {}
        # With team queues, an elastic task is admitted at its minimum; what it takes beyond that comes out of its
        # queue's room (idle quota, then what it may borrow, within its limit), booked here for the whole cycle.
        room: QueueRoom | None = None   # built for the first elastic task (it costs a pass over the nodes)
        beyond: dict[str, int] = {}     # elastic task → GPUs beyond its minimum booked in its queue's room, borrowed
        if self._elastic is not None:
            for i, r in enumerate(requests):
                rng = self._elastic.range(by_id[r.task_id])
                if rng is not None:   # at its first size; smaller when that is refused, more when GPUs are left
                    ranges[r.task_id] = rng
                    size = first_size(rng, by_id[r.task_id].elastic.target_gpus)
                    if room is None and plan is not None and self._queues is not None:
                        room = self._queues.room(plan.use)
                    if room is not None and plan is not None:
                        size = _in_room(room, (queue_of(by_id[r.task_id]), plan.admissions[r.task_id].pool), rng,
                                        rng.minimum, size, beyond, r.task_id)
                    requests[i] = request_at(r, rng, size)
        snapshot = self._snapshots.snapshot(self._tasks.live(), self._registry)
        policy = self._policy.current
        mode = threshold_mode(policy)
        # Reservations: their own work first on the GPUs they keep, then every kept GPU blocked for the rest.
        early, snapshot = self._reserved_first(snapshot, requests, by_id, policy.name, policy.threshold, mode)
        # The placement state is kept from cycle to cycle; only nodes whose snapshot changed are applied.
        engine = self._placement.engine(snapshot, policy.name, threshold=policy.threshold, mode=mode,
                                        gang_label=self._gang_label)
        if early:
            rest = iter(engine.place_batch([r for r in requests if r.task_id not in early]))
            decisions = [early[r.task_id] if r.task_id in early else next(rest) for r in requests]
        else:
            decisions = engine.place_batch(requests)
        if ranges:
            for i, (r, d) in enumerate(zip(requests, decisions, strict=True)):
                if r.task_id in ranges and not isinstance(d, Placement) and r.whole_gpus * r.nodes > \
                        ranges[r.task_id].minimum:
                    smaller = place_down(engine, r, ranges[r.task_id], r.whole_gpus * r.nodes)
                    if smaller is not None:
                        decisions[i] = smaller
                        requests[i] = request_at(r, ranges[r.task_id], placement_gpus(smaller))
            decisions = self._size_elastic(engine, requests, decisions, ranges, by_id, plan, room, beyond)
        self._metrics.decision_latency.observe((time.perf_counter() - started) / max(1, len(requests)))
        commits: list[PlacementCommit] = []
        rejected: list[types_pb2.Task] = []
        ports = PortBook.of(self._tasks.live(), refused=self._refused_ports())
        uid_room = dict(self._snapshots.uid_room)
        self._uid_full = sum(1 for left in uid_room.values() if left <= 0)
        self._health = None   # built at this cycle's first rejection
        for decision in decisions:
            task = by_id[decision.task_id]
            if isinstance(decision, Placement):
                if plan is not None:
                    marked = self._borrowing(task, decision, plan.admissions[task.id], beyond.get(task.id, 0))
                    if marked is None:
                        self._metrics.decisions.labels(outcome="waiting").inc()
                        continue
                    task = marked
                roomy = self._with_room(task, decision, uid_room, ports)
                if roomy is None:
                    self._metrics.decisions.labels(outcome="waiting").inc()
                    continue
                decision, port = roomy
                if task.id in ranges:
                    task = _sized(task, decision)
                commits.append((task, task.revision, self._allocation(task, decision, port)))
                self._metrics.decisions.labels(outcome="placed").inc()
            else:
                self._metrics.decisions.labels(outcome="waiting").inc()
                self._note_rejection(task, decision, policy.name)
                rejected.append(task)
        committed = await self._commit(commits) if commits else 0
        resized = False
        if self._elastic is not None:
            waiting = [r for r, d in zip(requests, decisions, strict=True) if not isinstance(d, Placement)]
            nodes = [engine.node_snapshot(i) for i in range(len(snapshot.nodes))]
            refused = [(by_id[t], why) for t, why in plan.refused.items() if t in by_id] if plan is not None else []
            resized = await self._elastic_step(waiting, nodes, refused)
        # A shrink makes room for what waits more cheaply than a preemption: none this cycle.
        preempted = resized or (bool(rejected) and await self._preemptor.after_rejections(
            rejected, policy.name, policy.threshold, mode))
        if plan is not None and await self._reclaim(plan, {c[0].id for c in commits}, by_id):
            preempted = True
        self._metrics.sched_latency.observe(time.perf_counter() - started)
        self.cycles += 1
        if not commits and not preempted:
            self._idle = (inputs, started)
        return committed

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
    def _reserved_first(self, snapshot: ClusterSnapshot, requests: list[Request], by_id: dict[str, types_pb2.Task],
                        policy: str, threshold: float, mode: str) -> tuple[dict[str, Placement], ClusterSnapshot]:
        """Place each active reservation's own waiting work on the GPUs it keeps (a placement engine of its own
        over only those GPUs); returns those placements and the snapshot the rest is placed on: every kept GPU
        offering nothing, the host resources of those placements taken (``coordinator/reservations.py``)."""
        kept = self._reservations.kept() if self._reservations is not None else []
        if not kept:
            return {}, snapshot
        assert self._reservations is not None
        original = {n.node_id: n for n in snapshot.nodes}
        early: dict[str, Placement] = {}
        for k in kept:
            mine = [r for r in requests if self._reservations.active_member_of(by_id[r.task_id], kept) is k]
            if not mine:
                continue
            engine = PlacementEngine.from_name(keep_only(snapshot.nodes, original, k.by_node(), snapshot.taken_at_s),
                                               policy, threshold=threshold, mode=mode)
            early.update((d.task_id, d) for d in engine.place_batch(mine) if isinstance(d, Placement))
        every: dict[str, set[int]] = {}
        for k in kept:
            for node, index in k.gpus:
                every.setdefault(node, set()).add(index)
        out = blocked(snapshot, {n: frozenset(s) for n, s in every.items()})
        if early:
            used: dict[str, Resources] = {}
            for d in early.values():
                for a in d.assignments:
                    used[a.node_id] = used.get(a.node_id, Resources()).add(d.demand)
            out = replace(out, nodes=tuple(replace(n, used=n.used.add(used[n.node_id])) if n.node_id in used else n
                                           for n in out.nodes))
        return early, out

    def _elastic_settled(self, *, grow: bool = False) -> int:
        """Running elastic tasks whose hysteresis allows a resize now (``grow``: and below their maximum)."""
        if self._elastic is None:
            return 0
        now, interval = time.time(), self._elastic.settings.interval_s
        return sum(1 for j in self._elastic.jobs()
                   if j.settled(now, interval) and (not grow or j.size < j.range.maximum))

    def _size_elastic(self, engine: PlacementEngine, requests: list[Request], decisions: list[Decision],
                      ranges: dict[str, ElasticRange], by_id: dict[str, types_pb2.Task],
                      plan: QueuePlan | None, room: QueueRoom | None, beyond: dict[str, int]) -> list[Decision]:
        """Elastic tasks placed at their first size take the idle GPUs left over, when nothing was left waiting (with
        team queues, within what their queue's room allows: they may borrow, within the queue's limit)."""
        assert self._elastic is not None
        pairs = list(zip(requests, decisions, strict=True))
        if any(not isinstance(d, Placement) and r.whole_gpus > 0 for r, d in pairs):
            return decisions
        placed = [(r, ranges[r.task_id], self._elastic.curve(by_id[r.task_id]), d,
                   self._elastic.wish(by_id[r.task_id], ranges[r.task_id]))
                  for r, d in pairs if isinstance(d, Placement) and r.task_id in ranges]
        if plan is not None and room is not None:
            capped: list[tuple[Request, ElasticRange, SpeedupCurve, Placement, int]] = []
            for r, rng, curve, placement, wish in placed:
                size = placement_gpus(placement)
                key = (queue_of(by_id[r.task_id]), plan.admissions[r.task_id].pool)
                capped.append((r, rng, curve, placement, _in_room(room, key, rng, size, max(size, wish), beyond,
                                                                    r.task_id)))
            placed = capped
        if not placed:
            return decisions
        nodes = [engine.node_snapshot(i) for i in range(len(engine.state.nodes))]
        sized = size_placements(engine, placed, idle_gpus(nodes))
        out: list[Decision] = []
        for r, decision in pairs:
            if r.task_id not in sized:
                out.append(decision)
                continue
            new = sized[r.task_id]
            out.append(new if new is not None else Rejection(r.task_id, "its GPUs were taken while it was sized"))
        return out

    async def _elastic_step(self, waiting: list[Request], nodes: Sequence[NodeSnapshot],
                            refused: Sequence[tuple[types_pb2.Task, str]] = ()) -> bool:
        """Shrink running elastic tasks for what waits — for a placement, or (team queues) for the admission a task
        of their queue was refused — or grow them into idle GPUs when nothing does; True when a resize is under way.
        Why each task that could be bigger does not grow is noted with the allocator (``gptrmctl tasks TASK``)."""
        assert self._elastic is not None
        jobs = self._elastic.jobs()
        if not jobs:
            return False
        idle = idle_gpus(nodes)
        now, settings = time.time(), self._elastic.settings
        blocked: dict[str, str] = {}
        # Giving back GPUs a reservation keeps comes first; the rest is planned in the next cycle.
        decisions: list[Resize] = self._off_reserved(jobs, now)
        if waiting and not decisions:
            by_node = {n.node_id: n for n in nodes}
            decisions = plan_shrinks(waiting, jobs, idle, now, settings,
                                     accepts=lambda req, nid: nid in by_node and node_accepts(by_node[nid], req))
        decisions = decisions or self._give_back(refused, jobs, now, settings)
        if waiting or decisions:
            for j in jobs:
                blocked[j.task_id] = ("tasks wait for GPUs, or for elastic tasks of their queue to give some back: "
                                      "elastic tasks grow only when none does")
        else:
            decisions = self._grows_within_room(jobs, idle, now, settings, self._move_accepts(nodes), blocked)
        for d in decisions:
            blocked[d.task_id] = ""
        self._elastic.note_blocked(blocked)
        done = set(await self._elastic.resize(decisions)) if decisions else set()
        gave: dict[str, int] = {}
        for d in decisions:
            if d.task_id in done and d.for_task:
                gave[d.for_task] = gave.get(d.for_task, 0) + d.from_gpus - d.to_gpus
        for task_id, gpus in sorted(gave.items()):
            self._on_shrunk(task_id, gpus)
        return bool(done)

    def _off_reserved(self, jobs: list[ElasticJob], now: float) -> list[Resize]:
        """Elastic tasks give back, ahead of a reservation's start, the GPUs it keeps (:func:`shrinks_off`)."""
        if self._reservations is None:
            return []
        return shrinks_off(jobs, self._reservations.kept(), self._tasks.view(), now, RESERVATION_LEAD_S)

    def _give_back(self, refused: Sequence[tuple[types_pb2.Task, str]], jobs: list[ElasticJob], now: float,
                   settings: ElasticSettings) -> list[Resize]:
        """Team queues: for the first task (in fair order) of each queue that its queue refused and that fewer GPUs
        held by the queue's running elastic tasks would let in (its limit, or what it may borrow), those tasks shrink
        (:func:`~coordinator.elastic.rules.plan_give_back`). Not while an elastic task of the queue is still stopping
        for a resize: what it gives back is on its way."""
        if not refused or self._queues is None or not self._queues.config.managed:
            return []
        keys = {j.task_id: self._queue_pool(j.task_id) for j in jobs}
        pools: dict[str, set[str]] = {}
        for key in keys.values():
            if key is not None:
                pools.setdefault(key[0], set()).add(key[1])
        stopping = {queue_of(t) for t in self._tasks.live()
                    if t.state == TaskState.PREEMPTED and t.spec.HasField("elastic")}
        config, use, capacity = self._queues.config, self._queues.use(), self._queues.capacity()
        out: list[Resize] = []
        done: set[str] = set()
        for task, why in refused:
            queue = queue_of(task)
            if queue in done or queue in stopping or queue not in pools:
                continue
            for pool in sorted(pools[queue]):
                group = [j for j in jobs if keys[j.task_id] == (queue, pool)]
                need = shrink_needed(config, use, capacity, queued(task), pool,
                                     sum(j.size - j.range.minimum for j in group))
                resizes = [] if need is None else plan_give_back(task.id, task.spec.priority, need, group, now,
                                                                  settings, f"its queue ({why})")
                if resizes:
                    out += resizes
                    done.add(queue)
                    break
        return out

    def _move_accepts(self, nodes: Sequence[NodeSnapshot]) -> Callable[[str, str], bool]:
        """Whether a running elastic task may move to a node to grow: its constraints allow the node (and, with team
        queues, the node is in the GPU pool its queue admitted it in)."""
        by_node = {n.node_id: n for n in nodes}
        requests: dict[str, Request | None] = {}

        def accepts(task_id: str, node_id: str) -> bool:
            if task_id not in requests:
                task = self._tasks.find(task_id)
                req = request_for(task) if task is not None else None
                key = self._queue_pool(task_id)
                requests[task_id] = on_pool(req, key[1]) if req is not None and key is not None else req
            req = requests[task_id]
            return req is not None and node_id in by_node and node_accepts(by_node[node_id], req)

        return accepts

    def _queue_pool(self, task_id: str) -> tuple[str, str] | None:
        """(queue, GPU pool) of a placed task, when team queues are in force."""
        task = self._tasks.find(task_id)
        if self._queues is None or not self._queues.config.managed or task is None:
            return None
        return queue_of(task), self._queues.pool_of_task(task)

    def _grows_within_room(self, jobs: list[ElasticJob], idle: dict[str, int], now: float, settings: ElasticSettings,
                           accepts: Callable[[str, str], bool], blocked: dict[str, str]) -> list[Resize]:
        """:func:`plan_grows`; with team queues, each job may grow at most into its queue's room in its GPU pool (its
        idle quota, then what it may borrow, within the queue's limits: what it borrows is reclaimed like any
        borrowed GPU), and the grows are kept (first come first kept) while they fit that together. What keeps each
        job that could be bigger from growing goes into ``blocked``."""
        room = self._queues.room() if self._queues is not None and self._queues.config.managed else None
        keys = {j.task_id: self._queue_pool(j.task_id) for j in jobs}
        full: dict[str, str] = {}
        said: dict[tuple[str, str], str] = {}
        capped = []
        for j in jobs:
            key = keys[j.task_id]
            if room is None or key is None:
                capped.append(j)
                continue
            left = room.of(*key)
            if left <= 0 and j.size < j.range.maximum:
                full[j.task_id] = said[key] if key in said else said.setdefault(key, self._queue_full(*key))
            top = min(j.range.max_gpus, j.size + left)
            capped.append(replace(j, range=ElasticRange(j.range.min_gpus, max(j.size, top), j.range.node_gpus)))
        out = []
        for r in plan_grows(capped, idle, now, settings, accepts):
            key = keys[r.task_id]
            extra = r.to_gpus - r.from_gpus
            if room is None or key is None:
                out.append(r)
            elif room.of(*key) >= extra:
                room.take(*key, extra)
                out.append(r)
            else:
                full[r.task_id] = said[key] if key in said else said.setdefault(key, self._queue_full(*key))
        grown = {r.task_id for r in out}
        any_idle = any(v > 0 for v in idle.values())
        for j in jobs:
            if j.task_id in grown:
                continue
            if j.size >= j.range.maximum:
                blocked[j.task_id] = ""
            elif not j.settled(now, settings.interval_s):
                blocked[j.task_id] = self._unsettled(j)
            elif j.task_id in full:
                blocked[j.task_id] = full[j.task_id]
            elif not any_idle or not any(v > 0 and (n == j.nodes[0][0] or accepts(j.task_id, n))
                                         for n, v in idle.items()):
                blocked[j.task_id] = "no idle GPUs on a ready node it may run on"
            else:
                blocked[j.task_id] = (f"a bigger size would not pay back its restart ({j.restart_cost_s:.0f} s) "
                                      f"within {settings.horizon_s:.0f} s, or no node it may use has room for one")
        return out

    def _unsettled(self, job: ElasticJob) -> str:
        """Why a job does not grow when nothing waits and none could: its hysteresis, or nothing."""
        assert self._elastic is not None
        interval = self._elastic.settings.interval_s
        if job.size >= job.range.maximum or job.settled(time.time(), interval):
            return ""
        return f"resized {time.time() - (job.last_resize_s or 0):.0f} s ago: at most one resize per {interval:g} s"

    def _queue_full(self, queue: str, pool: str) -> str:
        """Why a queue has no room for one more GPU in ``pool``: its admission's refusal, in words."""
        assert self._queues is not None
        decision = admit(self._queues.config, self._queues.use(), self._queues.capacity(),
                         Demand(queue, pool, 1))
        if decision.admit:
            return f"queue {queue}: no room left in this cycle"
        return decision.reason.removeprefix(f"[{pool}] ")     # one pool asked: no need to name it

    def _borrowing(self, task: types_pb2.Task, placement: Placement, admission: AdmissionDecision,
                   beyond: int = 0) -> types_pb2.Task | None:
        """The task as it is committed: with the GPUs its queue borrows for it (its admission's, plus ``beyond``:
        what an elastic task borrows above its minimum; a copy: the record in the leader state changes only when
        etcd stored the placement). None when it was placed on GPUs of another pool than its queue admitted it in
        (only possible for an any-model task when some queue names a model): it waits for the next cycle."""
        assert self._queues is not None
        model = self._queues.placed_model(placement)
        if model is not None and self._queues.config.pool_of(model) != admission.pool:
            self._tasks.note_reason(task.id, f"admitted in GPU pool {admission.pool!r}, placed on {model!r}: "
                                             "waiting for room in its pool")
            return None
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
        stopped = [tid for queue, tasks in sorted(for_queue.items())
                   for tid in await self._preemptor.reclaim(tasks, queue)]
        return bool(stopped)

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
                   ports: PortBook) -> tuple[Placement, int] | None:
        """The placement as committed, with the room its agents count beyond resources (``agent/room.py``):
        a task uid on every node (``uid_room``: what each node can still take this cycle, taken here) and,
        for a multi-node task, a master port on rank 0 (the first node of the placement whose agent reports
        a free port of its range, made rank 0; the port taken from ``ports``). None, with the task's reason
        noted, when a node lacks either: it waits for the next cycle, where a node without a free uid is
        unschedulable."""
        nodes = placement.node_ids
        if takes_uid(task):
            full = [n for n in nodes if uid_room.get(n, 1) <= 0]
            if full:
                self._tasks.note_reason(task.id, f"waiting for a task uid: node {full[0]} has none free (every uid "
                                                 "of its agent's --task-uids is in use)")
                return None
        port = 0
        if len(placement.assignments) > 1:
            for k, a in enumerate(placement.assignments):
                entry = self._registry.get(a.node_id)
                if entry is None:
                    continue
                free = entry.task_ports_free
                if free is not None and free <= ports.taken_here(a.node_id):
                    continue
                port = ports.take(a.node_id, entry.inventory.task_port_min, entry.inventory.task_port_max)
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

    def _allocation(self, task: types_pb2.Task, placement: Placement, port: int) -> types_pb2.Allocation:
        """The allocation of a placement: nodes in rank order with their addresses, and for a multi-node task
        the master port reserved on the rank-0 node (see :mod:`coordinator.dispatch.launch`)."""
        alloc = types_pb2.Allocation(task_id=task.id, leader_epoch=self._leadership.epoch,
                                     decision_id=f"d-{uuid.uuid4().hex[:12]}", created_unix_s=time.time())
        d = task.demand
        for a in placement.assignments:
            entry = self._registry.get(a.node_id)
            uuids = {g.index: g.uuid for g in entry.inventory.gpus} if entry else {}
            n = len(a.gpu_indices)
            alloc.nodes.append(types_pb2.NodeAllocation(
                node_id=a.node_id, gpu_indices=list(a.gpu_indices), gpu_uuids=[uuids.get(i, "") for i in a.gpu_indices],
                gpu_share=a.gpu_share, address=node_address(entry.inventory) if entry else a.node_id,
                # On the node, GPU memory is the total of its GPUs (Task.demand holds it per GPU).
                demand=types_pb2.ResourceVector(gpus=d.gpus, gpu_mem_bytes=d.gpu_mem_bytes * max(n, 1),
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
        reason = rejection.reason
        if self._uid_full:
            reason += (f"; {self._uid_full} node(s) have no free task uid (every uid of their agent's --task-uids "
                       "is in use)")
        if self._health is None:
            held = [e for e in self._registry if e.health_pending or e.record.health_drained or e.record.gpu_fences]
            self._health = "; ".join(health_notes(
                (e.node_id, e.record, e.health_pending) for e in sorted(held, key=lambda e: e.node_id)))
        if self._health:
            reason += "; " + self._health
        if reason != task.reason:
            self._tasks.note_reason(task.id, reason)   # shown by `gptrmctl tasks`
        if rejection.scale_out:
            self._scale_out.request(task.id, rejection.reason, policy=policy)
        self._on_unplaced(task)


def _sized(task: types_pb2.Task, placement: Placement) -> types_pb2.Task:
    """An elastic task as it is committed: with the GPUs of its placement (a copy)."""
    sized = types_pb2.Task()
    sized.CopyFrom(task)
    sized.elastic.gpus = placement_gpus(placement)
    return sized


def _in_room(room: QueueRoom, key: tuple[str, str], rng: ElasticRange, size: int, wish: int, beyond: dict[str, int],
             task_id: str) -> int:
    """The size of its range up to ``wish`` that an elastic task holding (or placed at) ``size`` may take within its
    queue's room; the GPUs above ``size`` are booked in the room, and what of them is borrowed added to
    ``beyond[task_id]``."""
    top = rng.clamp(min(wish, size + room.of(*key)))
    if top > size:
        beyond[task_id] = beyond.get(task_id, 0) + room.take(*key, top - size)
        return top
    return size
