"""The scheduling pipeline's decisions, as pure functions of plain data: run by the leader and the simulator.

A cycle is snapshot → plan → commit → dispatch. Its two planning steps live here and nowhere else:

* :func:`plan_placements` — the pending tasks (:class:`PendingTask`: placement request, queue view, elastic range,
  reservation membership), the cluster, the team queues' state (:class:`QueueState`) and ``now`` in; out comes a
  :class:`PlacementPlan`: queue order (:func:`coordinator.domain.queue_key`: priority, then slack, then submit time),
  the queues' admission and fair order (:func:`~coordinator.queues.planning.plan_queues`), elastic tasks at
  their first size (within their queue's room), each active reservation's own work on the GPUs it keeps, the
  placement engine's batch (the tasks of queues that reclaimed GPUs for them ahead of the rest: a reclaim's claim
  holds), elastic tasks placed smaller when refused and sized into what is left over, and the reason each task is
  left waiting.
* :func:`plan_resizes` — after the placements are committed, the running elastic jobs, the nodes as the
  placements left them, what waits and the queues' use in; out comes a :class:`ResizePlan`: GPUs given back
  ahead of a reservation, shrinks for what waits (for a placement, or a queue's admission), or grows into idle
  GPUs when nothing waits, and why each job that could be bigger does not grow.

Nothing here does I/O, reads a clock or holds service objects: ``now`` is an input, and the one piece of working
state is the placement engine (:class:`~coordinator.scheduler.placement.engine.PlacementEngine`), which the
caller builds from its snapshot (``engine_for``) and in which the plan reserves its placements. Preemption
victims and queue reclaims are chosen by the pure rules :func:`coordinator.qos.preemption.choose_candidates`
and :func:`coordinator.queues.planning.reclaim_for`, over the tasks the placement plan left waiting.

The leader (:class:`coordinator.scheduler.cycle.SchedulerCycle`) gathers the inputs from its state, commits the
placements to etcd (fenced), then plans the resizes on what was committed and carries them out. The simulator
(:class:`coordinator.simulator.engine.Simulator`) gathers the same inputs from its replay, books the placements
in virtual time, and plans the resizes the same way; its placement engine lives for the whole replay, and its
:class:`Placer` (the pass over shape buckets) decides what ``place_batch`` would, cheaper.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from common.pb.gptrm.v1 import types_pb2
from coordinator.domain import (
    ClusterSnapshot,
    Decision,
    NodeSnapshot,
    Placement,
    Rejection,
    Request,
    Resources,
    queue_key,
)
from coordinator.elastic.rules import (
    NO_CURVE,
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
from coordinator.queues import ANY_MODEL, Demand, QueueConfig, QueueHolding, QueueUse, UsageDecay, admit
from coordinator.queues.budget import Gate
from coordinator.queues.planning import QueuedTask, QueuePlan, QueueRoom, plan_queues, shrink_needed
from coordinator.reservations import Kept, blocked, keep_only, shrinks_off
from coordinator.scheduler.placement.engine import PlacementEngine

__all__ = ["RESERVATION_LEAD_S", "PendingTask", "PlacementInputs", "PlacementPlan", "Placer", "QueueState",
           "RefusedTask", "ResizeInputs", "ResizePlan", "on_pool", "place_smaller", "plan_placements", "plan_resizes",
           "size_elastic", "unsettled", "wish"]

RESERVATION_LEAD_S = 120.0
"""Elastic tasks holding GPUs a reservation keeps (not its own work) give them back this long before its start."""

Placer = Callable[[PlacementEngine, Sequence[Request]], list[Decision]]
"""Places a batch in the order given on an engine (default: ``engine.place_batch``)."""

_WAIT_TO_GROW = ("tasks wait for GPUs, or for elastic tasks of their queue to give some back: "
                 "elastic tasks grow only when none does")


def on_pool(request: Request, pool: str) -> Request:
    """A request held to the GPU pool its queue admitted it in (a pool a queue names is one GPU model)."""
    if pool == ANY_MODEL or request.gpu_model:
        return request
    return replace(request, gpu_model=pool)


def wish(rng: ElasticRange, target_gpus: int) -> int:
    """The size a pending elastic task's placement aims at: the allocator's target (a resize's), else its maximum."""
    return rng.clamp(target_gpus) if target_gpus else rng.maximum


def unsettled(job: ElasticJob, now: float, interval_s: float) -> str:
    """Why a job does not grow when nothing waits and none could: its hysteresis, or nothing ("")."""
    if job.size >= job.range.maximum or job.settled(now, interval_s):
        return ""
    return f"resized {now - (job.last_resize_s or 0):.0f} s ago: at most one resize per {interval_s:g} s"


# ---- placement --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PendingTask:
    """A task waiting to be placed, as the plan sees it.

    :param request: its placement request at its whole demand (queue position and expected run time included).
    :param queued: its team-queue view (None: no team queues).
    :param elastic: its elastic range (None: rigid).
    :param target_gpus: an elastic task's target size (a resize's; 0: none).
    :param curve: an elastic task's learned speed-up curve.
    :param reservation: index in :attr:`PlacementInputs.kept` of the active reservation it is the own work of
        (-1: none).
    """

    request: Request
    queued: QueuedTask | None = None
    elastic: ElasticRange | None = None
    target_gpus: int = 0
    curve: SpeedupCurve = NO_CURVE
    reservation: int = -1


@dataclass(frozen=True, slots=True)
class QueueState:
    """The team queues as a cycle plans them.

    :param config: the queue tree (managed).
    :param holdings: every task holding GPUs (PREEMPTED ones on their way out included).
    :param capacity: the cluster's GPUs per model.
    :param decay: each queue's decayed past usage (read only).
    :param gates: each queue's budget gate (only queues past a budget).
    :param now: the time the queues' usage is accounted at (None: the plan's ``now``).
    """

    config: QueueConfig
    holdings: Sequence[QueueHolding]
    capacity: Mapping[str, int]
    decay: UsageDecay
    gates: Mapping[str, Gate] = field(default_factory=dict)
    now: float | None = None


@dataclass(frozen=True, slots=True)
class PlacementInputs:
    """What :func:`plan_placements` decides on.

    :param now: the cycle's time (unix or virtual seconds).
    :param pending: the tasks that may be placed (workflow rules and preemption holds already applied), any order.
    :param engine_for: the placement engine over a snapshot (the leader's kept state; the simulator's engine).
    :param snapshot: the cluster (None: the engine's own view; only without ``kept``).
    :param queues: the team queues (None: none, every pending task may be placed).
    :param kept: the GPUs each reservation keeps.
    :param policy: policy name, threshold and threshold mode (a reservation's own work is placed with them).
    :param place: places a batch (default ``engine.place_batch``).
    :param claims: queues that reclaimed borrowed GPUs for their waiting tasks (team queues): those tasks are
        placed ahead of the rest of the batch, so that what was reclaimed for them does not go back to a borrower
        placed before them (which would be reclaimed again, cycle after cycle). The caller keeps a claim until
        a plan ran with its victims' GPUs free.
    """

    now: float
    pending: Sequence[PendingTask]
    engine_for: Callable[[ClusterSnapshot | None], PlacementEngine]
    snapshot: ClusterSnapshot | None = None
    queues: QueueState | None = None
    kept: Sequence[Kept] = ()
    policy: str = ""
    threshold: float = 1.0
    mode: str = ""
    place: Placer | None = None
    claims: frozenset[str] = frozenset()


@dataclass(slots=True)
class PlacementPlan:
    """What :func:`plan_placements` decided.

    :param requests: the requests placed, in the order tried (elastic ones at the size tried, held to their
        admitted pool).
    :param decisions: a placement or a rejection (with its reason) for each.
    :param queues: the queues' plan (None: no team queues); its ``refused`` tasks were not tried.
    :param beyond: elastic task → GPUs beyond its minimum booked in its queue's room, borrowed.
    :param ranges: the elastic tasks tried → their range.
    :param engine: the placement engine with the placements reserved (its node snapshots feed the resizes).
    """

    requests: list[Request]
    decisions: list[Decision]
    queues: QueuePlan | None
    beyond: dict[str, int]
    ranges: dict[str, ElasticRange]
    engine: PlacementEngine

    def placements(self) -> list[Placement]:
        """The placements, in order."""
        return [d for d in self.decisions if isinstance(d, Placement)]

    def waiting(self) -> list[Request]:
        """The requests tried and left waiting."""
        return [r for r, d in zip(self.requests, self.decisions, strict=True) if not isinstance(d, Placement)]

    def reasons(self) -> dict[str, str]:
        """Task id → why it waits: its queue's refusal, or its placement's rejection."""
        out = dict(self.queues.refused) if self.queues is not None else {}
        out.update((d.task_id, d.reason) for d in self.decisions if isinstance(d, Rejection))
        return out


def plan_placements(inputs: PlacementInputs) -> PlacementPlan:
    """The placement half of a cycle (module docstring)."""
    by_id = {p.request.task_id: p for p in inputs.pending}
    requests = sorted((p.request for p in inputs.pending), key=queue_key)
    qplan: QueuePlan | None = None
    q = inputs.queues
    if q is not None and q.config.managed:
        queued = [by_id[r.task_id].queued for r in requests]
        assert all(t is not None for t in queued), "with team queues every pending task has its queue view"
        qplan = plan_queues(q.config, queued, q.holdings, q.capacity, q.decay,  # type: ignore[arg-type]
                            inputs.now if q.now is None else q.now, q.gates)
        by_request = {r.task_id: r for r in requests}
        requests = [on_pool(by_request[task_id], qplan.admissions[task_id].pool) for task_id in qplan.order]
    ranges: dict[str, ElasticRange] = {}
    # With team queues, an elastic task is admitted at its minimum; what it takes beyond that comes out of its
    # queue's room (idle quota, then what it may borrow, within its limit), booked here for the whole cycle.
    room: QueueRoom | None = None   # built for the first elastic task
    beyond: dict[str, int] = {}     # elastic task → GPUs beyond its minimum booked in its queue's room, borrowed
    for i, r in enumerate(requests):
        p = by_id[r.task_id]
        rng = p.elastic
        if rng is None:
            continue
        ranges[r.task_id] = rng   # at its first size; smaller when that is refused, more when GPUs are left
        size = first_size(rng, p.target_gpus)
        if qplan is not None and q is not None and p.queued is not None:
            if room is None:
                room = QueueRoom(q.config, qplan.use, q.capacity)
            size = _in_room(room, (p.queued.queue, qplan.admissions[r.task_id].pool), rng, rng.minimum, size, beyond,
                            r.task_id)
        requests[i] = request_at(r, rng, size)
    # Reservations: their own work first on the GPUs they keep, then every kept GPU blocked for the rest.
    snapshot = inputs.snapshot
    early: dict[str, Placement] = {}
    if inputs.kept and snapshot is not None:
        early, snapshot = _reserved_first(snapshot, requests, by_id, inputs)
    engine = inputs.engine_for(snapshot)
    place = inputs.place or (lambda eng, batch: eng.place_batch(batch))
    ahead: list[Request] = []
    if inputs.claims and qplan is not None:
        ahead = [r for r in requests if r.task_id not in early
                 and (t := by_id[r.task_id].queued) is not None and t.queue in inputs.claims]
    if ahead:
        decided: dict[str, Decision] = dict(early)
        decided.update((d.task_id, d) for d in place(engine, ahead))
        behind = [r for r in requests if r.task_id not in decided]
        if behind:
            decided.update((d.task_id, d) for d in place(engine, behind))
        decisions = [decided[r.task_id] for r in requests]
    elif early:
        rest = iter(place(engine, [r for r in requests if r.task_id not in early]))
        decisions = [early[r.task_id] if r.task_id in early else next(rest) for r in requests]
    else:
        decisions = place(engine, requests)
    if ranges:
        for i, (r, d) in enumerate(zip(requests, decisions, strict=True)):
            if r.task_id in ranges and not isinstance(d, Placement):
                smaller = place_smaller(engine, r, ranges[r.task_id])
                if smaller is not None:
                    decisions[i], requests[i] = smaller
        if not any(not isinstance(d, Placement) and r.whole_gpus > 0 for r, d in zip(requests, decisions, strict=True)):
            # Nothing whole was left waiting: the elastic tasks placed take the idle GPUs left over, each up to its
            # wish (with team queues, within what their queue's room allows: they may borrow, within its limit).
            batch = []
            for r, d in zip(requests, decisions, strict=True):
                if not isinstance(d, Placement) or r.task_id not in ranges:
                    continue
                p = by_id[r.task_id]
                want = wish(ranges[r.task_id], p.target_gpus)
                if qplan is not None and room is not None and p.queued is not None:
                    size = placement_gpus(d)
                    want = _in_room(room, (p.queued.queue, qplan.admissions[r.task_id].pool), ranges[r.task_id], size,
                                    max(size, want), beyond, r.task_id)
                batch.append((r, d, ranges[r.task_id], p.curve, want))
            sized = size_elastic(engine, batch)
            for i, r in enumerate(requests):
                if r.task_id in sized:
                    new = sized[r.task_id]
                    decisions[i] = new if new is not None else Rejection(r.task_id,
                                                                         "its GPUs were taken while it was sized")
    if qplan is not None and q is not None and q.config.named_models:
        _held_to_pools(engine, q.config, qplan, requests, decisions, set(early))
    return PlacementPlan(requests, decisions, qplan, beyond, ranges, engine)


def _held_to_pools(engine: PlacementEngine, config: QueueConfig, qplan: QueuePlan, requests: Sequence[Request],
                   decisions: list[Decision], elsewhere: set[str]) -> None:
    """A task placed on GPUs of another pool than its queue admitted it in (an any-model task, on a model that a
    queue names: its request cannot exclude those models) is not started: it waits, with the reason, and its GPUs
    go back to the engine at once; the tasks of the batch left waiting are tried again on them (``place_batch``),
    until no placement is in another pool. ``elsewhere``: tasks placed on another engine (a reservation's own
    work), left as they are."""
    state = engine.state
    wrong: set[str] = set(elsewhere)
    while True:
        released = False
        for i, (r, d) in enumerate(zip(requests, decisions, strict=True)):
            if not isinstance(d, Placement) or r.task_id in wrong or not d.assignments[0].gpu_indices:
                continue
            model = state.nodes[state.index[d.assignments[0].node_id]].gpu_model or ANY_MODEL
            pool = qplan.admissions[r.task_id].pool
            if config.pool_of(model) != pool:
                engine.release(d, r.gpu_mem_per_gpu_bytes)
                decisions[i] = Rejection(r.task_id, f"admitted in GPU pool {pool!r}, placed on {model!r}: waiting "
                                                    "for room in its pool")
                wrong.add(r.task_id)
                released = True
        retry = [i for i, (r, d) in enumerate(zip(requests, decisions, strict=True))
                 if not isinstance(d, Placement) and r.task_id not in wrong]
        if not released or not retry:
            return
        for i, d in zip(retry, engine.place_batch([requests[i] for i in retry]), strict=True):
            decisions[i] = d


def place_smaller(engine: PlacementEngine, request: Request, rng: ElasticRange) -> tuple[Placement, Request] | None:
    """An elastic task refused at the size it asked for, placed at the largest smaller size of its range that fits
    (:func:`~coordinator.elastic.rules.place_down`), with its request at that size; None when it asked for its
    minimum or not even that fits."""
    size = request.whole_gpus * request.nodes
    if size <= rng.minimum:
        return None
    placement = place_down(engine, request, rng, size)
    return None if placement is None else (placement, request_at(request, rng, placement_gpus(placement)))


def size_elastic(engine: PlacementEngine, placed: Sequence[tuple[Request, Placement, ElasticRange, SpeedupCurve, int]],
                 ) -> dict[str, Placement | None]:
    """Elastic tasks just placed (``(request as placed, placement, range, curve, size wished)``) take the idle GPUs of
    the engine, each up to its wish (:func:`~coordinator.elastic.rules.size_placements`): task id → its new
    placement for those that got bigger, None for one whose GPUs were taken while it was sized (its placement is
    released: it waits). Only when no whole-GPU task was left waiting."""
    if not placed:
        return {}
    nodes = [engine.node_snapshot(i) for i in range(len(engine.state.nodes))]
    return size_placements(engine, [(r, rng, curve, p, want) for r, p, rng, curve, want in placed], idle_gpus(nodes))


def _reserved_first(snapshot: ClusterSnapshot, requests: Sequence[Request], by_id: Mapping[str, PendingTask],
                    inputs: PlacementInputs) -> tuple[dict[str, Placement], ClusterSnapshot]:
    """Place each active reservation's own waiting work on the GPUs it keeps (a placement engine of its own over only
    those GPUs); returns those placements and the snapshot the rest is placed on: every kept GPU offering nothing,
    the host resources of those placements taken (``coordinator/reservations.py``)."""
    original = {n.node_id: n for n in snapshot.nodes}
    early: dict[str, Placement] = {}
    for i, k in enumerate(inputs.kept):
        mine = [r for r in requests if by_id[r.task_id].reservation == i]
        if not mine:
            continue
        engine = PlacementEngine.from_name(keep_only(snapshot.nodes, original, k.by_node(), snapshot.taken_at_s),
                                           inputs.policy, threshold=inputs.threshold, mode=inputs.mode)
        early.update((d.task_id, d) for d in engine.place_batch(mine) if isinstance(d, Placement))
    every: dict[str, set[int]] = {}
    for k in inputs.kept:
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


def _in_room(room: QueueRoom, key: tuple[str, str], rng: ElasticRange, size: int, want: int, beyond: dict[str, int],
             task_id: str) -> int:
    """The size of its range up to ``want`` that an elastic task holding (or placed at) ``size`` may take within its
    queue's room; the GPUs above ``size`` are booked in the room, and what of them is borrowed added to
    ``beyond[task_id]``."""
    top = rng.clamp(min(want, size + room.of(*key)))
    if top > size:
        beyond[task_id] = beyond.get(task_id, 0) + room.take(*key, top - size)
        return top
    return size


# ---- resizes ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RefusedTask:
    """A task its team queue refused this cycle (its limit, or what it may borrow), in fair order."""

    task: QueuedTask
    priority: int
    reason: str


@dataclass(frozen=True, slots=True)
class ResizeInputs:
    """What :func:`plan_resizes` decides on.

    :param now: the cycle's time.
    :param settings: the allocator's hysteresis, default restart cost and horizon.
    :param jobs: the running elastic jobs.
    :param nodes: every node as this cycle's placements left it (ready flags and reservations).
    :param waiting: the placement requests left waiting, in queue order.
    :param requests: running job → its placement request (held to its queue's pool): where it may move to grow.
    :param refused: the tasks their queue refused, in fair order (team queues).
    :param queue_pools: running job → (its queue, the GPU pool it holds) (team queues; empty: none).
    :param queues: the queue tree, what each queue's placed tasks hold now, and the GPUs per model (team queues).
    :param stopping: queues with an elastic task still stopping for a resize (they give nothing back meanwhile).
    :param kept: the GPUs each reservation keeps; ``tasks``: every task by id (whose work a reservation is).
    :param explain: work out why each job that could be bigger does not grow (the simulator does without).
    """

    now: float
    settings: ElasticSettings
    jobs: Sequence[ElasticJob]
    nodes: Sequence[NodeSnapshot]
    waiting: Sequence[Request] = ()
    requests: Mapping[str, Request] = field(default_factory=dict)
    refused: Sequence[RefusedTask] = ()
    queue_pools: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    queues: tuple[QueueConfig, Mapping[str, QueueUse], Mapping[str, int]] | None = None
    stopping: frozenset[str] = frozenset()
    kept: Sequence[Kept] = ()
    tasks: Mapping[str, types_pb2.Task] = field(default_factory=dict)
    explain: bool = True


@dataclass(slots=True)
class ResizePlan:
    """What :func:`plan_resizes` decided: the resizes, and job → why it does not grow ("" nothing keeps it)."""

    resizes: list[Resize]
    blocked: dict[str, str]


def plan_resizes(inputs: ResizeInputs) -> ResizePlan:
    """The resize half of a cycle: GPUs a reservation keeps given back first; then shrinks for what waits — for a
    placement, or (team queues) for the admission a task of their queue was refused — or grows into idle GPUs when
    nothing does."""
    jobs = list(inputs.jobs)
    blocked: dict[str, str] = {}
    if not jobs:
        return ResizePlan([], blocked)
    nodes, now, settings = inputs.nodes, inputs.now, inputs.settings
    by_node = {n.node_id: n for n in nodes}
    idle = idle_gpus(nodes)
    decisions: list[Resize] = (shrinks_off(jobs, inputs.kept, inputs.tasks, now, RESERVATION_LEAD_S)
                               if inputs.kept else [])
    if inputs.waiting and not decisions:
        decisions = plan_shrinks(inputs.waiting, jobs, idle, now, settings,
                                 accepts=lambda req, nid: nid in by_node and node_accepts(by_node[nid], req))
    decisions = decisions or _give_back(inputs, jobs)
    if inputs.waiting or decisions:
        if inputs.explain:
            for j in jobs:
                blocked[j.task_id] = _WAIT_TO_GROW
    else:
        requests = inputs.requests

        def accepts(task_id: str, node_id: str) -> bool:
            req = requests.get(task_id)
            return req is not None and node_id in by_node and node_accepts(by_node[node_id], req)

        decisions = _grows_within_room(inputs, jobs, idle, accepts, blocked)
    for d in decisions:
        blocked[d.task_id] = ""
    return ResizePlan(decisions, blocked)


def _queue_full(inputs: ResizeInputs, queue: str, pool: str) -> str:
    """Why a queue has no room for one more GPU in ``pool``: its admission's refusal, in words."""
    assert inputs.queues is not None
    config, use, capacity = inputs.queues
    decision = admit(config, use, capacity, Demand(queue, pool, 1))
    if decision.admit:
        return f"queue {queue}: no room left in this cycle"
    return decision.reason.removeprefix(f"[{pool}] ")     # one pool asked: no need to name it


def _grows_within_room(inputs: ResizeInputs, jobs: list[ElasticJob], idle: dict[str, int],
                       accepts: Callable[[str, str], bool], blocked: dict[str, str]) -> list[Resize]:
    """:func:`plan_grows`; with team queues, each job may grow at most into its queue's room in its GPU pool (its
    idle quota, then what it may borrow, within the queue's limits: what it borrows is reclaimed like any borrowed
    GPU), and the grows are kept (first come first kept) while they fit that together. What keeps each job that
    could be bigger from growing goes into ``blocked`` (with ``explain``)."""
    now, settings = inputs.now, inputs.settings
    room = QueueRoom(*inputs.queues) if inputs.queues is not None else None
    keys = inputs.queue_pools
    full: dict[str, str] = {}
    said: dict[tuple[str, str], str] = {}
    capped = []
    for j in jobs:
        key = keys.get(j.task_id)
        if room is None or key is None:
            capped.append(j)
            continue
        left = room.of(*key)
        if left <= 0 and j.size < j.range.maximum:
            full[j.task_id] = said[key] if key in said else said.setdefault(key, _queue_full(inputs, *key))
        top = min(j.range.max_gpus, j.size + left)
        capped.append(replace(j, range=ElasticRange(j.range.min_gpus, max(j.size, top), j.range.node_gpus)))
    out = []
    for r in plan_grows(capped, idle, now, settings, accepts):
        key = keys.get(r.task_id)
        extra = r.to_gpus - r.from_gpus
        if room is None or key is None:
            out.append(r)
        elif room.of(*key) >= extra:
            room.take(*key, extra)
            out.append(r)
        else:
            full[r.task_id] = said[key] if key in said else said.setdefault(key, _queue_full(inputs, *key))
    if not inputs.explain:
        return out
    grown = {r.task_id for r in out}
    any_idle = any(v > 0 for v in idle.values())
    for j in jobs:
        if j.task_id in grown:
            continue
        if j.size >= j.range.maximum:
            blocked[j.task_id] = ""
        elif not j.settled(now, settings.interval_s):
            blocked[j.task_id] = unsettled(j, now, settings.interval_s)
        elif j.task_id in full:
            blocked[j.task_id] = full[j.task_id]
        elif not any_idle or not any(v > 0 and (n == j.nodes[0][0] or accepts(j.task_id, n))
                                     for n, v in idle.items()):
            blocked[j.task_id] = "no idle GPUs on a ready node it may run on"
        else:
            blocked[j.task_id] = (f"a bigger size would not pay back its restart ({j.restart_cost_s:.0f} s) "
                                  f"within {settings.horizon_s:.0f} s, or no node it may use has room for one")
    return out


def _give_back(inputs: ResizeInputs, jobs: list[ElasticJob]) -> list[Resize]:
    """Team queues: for the first task (in fair order) of each queue that its queue refused and that fewer GPUs held
    by the queue's running elastic tasks would let in (its limit, or what it may borrow), those tasks shrink
    (:func:`~coordinator.elastic.rules.plan_give_back`). Not while an elastic task of the queue is still stopping
    for a resize: what it gives back is on its way."""
    if not inputs.refused or inputs.queues is None:
        return []
    keys = inputs.queue_pools
    pools: dict[str, set[str]] = {}
    for key in keys.values():
        pools.setdefault(key[0], set()).add(key[1])
    config, use, capacity = inputs.queues
    out: list[Resize] = []
    done: set[str] = set()
    for refused in inputs.refused:
        task = refused.task
        queue = task.queue
        if queue in done or queue in inputs.stopping or queue not in pools:
            continue
        for pool in sorted(pools[queue]):
            group = [j for j in jobs if keys.get(j.task_id) == (queue, pool)]
            need = shrink_needed(config, use, capacity, task, pool, sum(j.size - j.range.minimum for j in group))
            resizes = [] if need is None else plan_give_back(task.task_id, refused.priority, need, group, inputs.now,
                                                              inputs.settings, f"its queue ({refused.reason})")
            if resizes:
                out += resizes
                done.add(queue)
                break
    return out
