"""Preemption: a pending task that cannot be placed takes what strictly-lower-priority work holds.

Victim choice (:func:`choose_candidates`, pure, over plain :class:`Candidate` values so that the
leader and the simulator call the same rule; :func:`choose_victims` is its view over stored tasks):
for a one-node task, the smallest set of preemptible, strictly-lower-priority tasks on one node
whose release lets the placement engine place it there; for a gang, the fewest nodes that need
victims. Among sets of the same size, the lowest priorities first, then the most recently started
(the least work lost). A task preempted less than the protection window ago is never chosen again, nor
one inside its protected run time (``spec.min_runtime_s``, ``coordinator.run_limits``).
Whether a set "frees enough" is asked of the placement engine itself, on the cycle's snapshot with
the victims' allocations given back through the allocator's reservation model, so preemption never
disagrees with placement.

The life of a victim (:class:`Preemptor`): ``RUNNING → PREEMPTED`` (a fenced transition that
keeps its allocation, so its GPUs are never given to the preemptor while it still runs; one write for all
the victims of a preemption, so a leader change never leaves some of them running), a StopTask
carrying its checkpoint signal (``SIGUSR1`` unless its spec names another; the agent sends it,
waits the stop grace, then stops the task), and, when its agent reports it ended,
``PREEMPTED → PENDING`` releasing its reservations, with its submit time and priority unchanged.
Until the preemptor is placed (or a claim expires), pending tasks of lower priority than it are
held back so they do not take the GPUs just freed for it.

A new leader keeps this safe without memory of the claims: PREEMPTED tasks still hold their
allocation in etcd and count as already freed when it plans, the agents' re-registration re-sends
their stop, and a PREEMPTED task no agent reports after the grace goes back to PENDING.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from prometheus_client import Counter

from common.errors import GptrmError
from common.logging import get_logger
from common.pb.gptrm.v1 import types_pb2
from common.types import TaskState
from coordinator.allocator.reservations import NodeReservation, give_back_gpu
from coordinator.dispatch.dispatcher import Dispatcher
from coordinator.domain import ClusterSnapshot, GpuSlot, NodeSnapshot, Placement, Request, Resources, queue_key
from coordinator.events import EventBus
from coordinator.monitor.nodes import NodeRegistry
from coordinator.profiler.qos_spec import DEFAULT_CHECKPOINT_SIGNAL
from coordinator.run_limits import protected_until_s
from coordinator.scheduler.placement import PlacementEngine
from coordinator.scheduler.policies import DEFAULT_THRESHOLD_MODE
from coordinator.scheduler.queue import request_for
from coordinator.scheduler.snapshot import SnapshotBuilder

if TYPE_CHECKING:
    from coordinator.tasks import TaskTable  # type only: the task table loads etcd, which the simulator does without

__all__ = ["DEFAULT_PROTECTION_S", "Candidate", "Fits", "NodeHolding", "Preemptor", "candidate", "choose_candidates",
           "choose_preemption", "choose_victims", "last_preempted_s", "lowest_preemptible", "release_holdings",
           "release_tasks", "started_s"]

DEFAULT_PROTECTION_S = 120.0
"""A task is not preempted again within this many seconds of its last preemption."""
_VICTIM_STATES = (TaskState.RUNNING, TaskState.PAUSED)
_MAX_CANDIDATES = 12      # per node; beyond that, the lowest-ordered ones
_MAX_CHECKS = 2000        # placement checks per node before the search settles for a greedy prefix
_CLAIM_SLACK_S = 30.0     # a claim lasts the victims' stop graces (twice: checkpoint, then stop) plus this


def started_s(task: types_pb2.Task) -> float:
    """When the task last started running (its submit time when it never did)."""
    for h in reversed(task.history):
        if h.state == TaskState.RUNNING:
            return h.time_unix_s
    return task.submit_unix_s


def last_preempted_s(task: types_pb2.Task) -> float | None:
    """When the task was last preempted, from its state history (None: never)."""
    for h in reversed(task.history):
        if h.state == TaskState.PREEMPTED:
            return h.time_unix_s
    return None


def _preemptible(task: types_pb2.Task) -> bool:
    return not task.spec.HasField("preemptible") or task.spec.preemptible


@dataclass(frozen=True, slots=True)
class NodeHolding:
    """What a running task holds on one node (a ``NodeAllocation``, or a simulated placement's assignment).

    :param node_id: the node.
    :param gpu_indices: its GPUs there.
    :param demand: what is reserved there (``gpu_mem_total_bytes`` over those GPUs).
    :param gpu_share: fraction of each of those GPUs.
    """

    node_id: str
    gpu_indices: tuple[int, ...]
    demand: Resources
    gpu_share: float = 1.0


@dataclass(frozen=True, slots=True)
class Candidate:
    """A running task as victim choice sees it (the leader's tasks and the simulator's jobs alike).

    :param id: the task id.
    :param priority: its priority.
    :param started_s: when it last started running.
    :param last_preempted_s: when it was last preempted (None: never).
    :param preemptible: whether it may be preempted at all.
    :param holds: what it holds, per node.
    :param protected_until_s: the end of its protected run time (``spec.min_runtime_s``): never a victim before.
    """

    id: str
    priority: int
    started_s: float
    last_preempted_s: float | None
    preemptible: bool
    holds: tuple[NodeHolding, ...]
    protected_until_s: float = 0.0


def _holding(na: types_pb2.NodeAllocation) -> NodeHolding:
    d = na.demand
    return NodeHolding(na.node_id, tuple(na.gpu_indices),
                       Resources(gpus=d.gpus, gpu_mem_total_bytes=d.gpu_mem_bytes, cpu_cores=d.cpu_cores,
                                 mem_bytes=d.mem_bytes, disk_bytes=d.disk_bytes), na.gpu_share or 1.0)


def candidate(task: types_pb2.Task) -> Candidate:
    """The victim-choice view of a stored task."""
    return Candidate(task.id, task.spec.priority, started_s(task), last_preempted_s(task), _preemptible(task),
                     tuple(_holding(na) for na in task.allocation.nodes), protected_until_s(task))


def _victim_order(c: Candidate) -> tuple[int, float, str]:
    """Lowest priority first, then the most recently started."""
    return c.priority, -c.started_s, c.id


def _without(node: NodeSnapshot, holdings: Iterable[NodeHolding]) -> NodeSnapshot:
    """The node with these holdings given back (reservation model of ``coordinator/allocator``)."""
    reservation = NodeReservation(node.used, ())
    gpus = {g.index: g for g in node.gpus}
    for h in holdings:
        reservation = reservation.remove(h.demand, ())
        per_gpu = h.demand.gpu_mem_total_bytes // max(1, len(h.gpu_indices))
        for i in h.gpu_indices:
            g = gpus.get(i)
            if g is not None:
                mem, share = give_back_gpu(g.mem_free_bytes, g.share_free, per_gpu, h.gpu_share or 1.0,
                                           g.mem_total_bytes)
                gpus[i] = GpuSlot(g.index, g.mem_total_bytes, int(mem), share, g.topology_group)
    return replace(node, used=reservation.used, gpus=tuple(gpus[i] for i in sorted(gpus)))


def release_holdings(snapshot: ClusterSnapshot, holdings: Iterable[NodeHolding]) -> ClusterSnapshot:
    """The snapshot as it would be once these holdings were given back."""
    by_node: dict[str, list[NodeHolding]] = {}
    for h in holdings:
        by_node.setdefault(h.node_id, []).append(h)
    if not by_node:
        return snapshot
    return replace(snapshot, nodes=tuple(_without(n, by_node[n.node_id]) if n.node_id in by_node else n
                                         for n in snapshot.nodes))


def release_tasks(snapshot: ClusterSnapshot, tasks: Iterable[types_pb2.Task]) -> ClusterSnapshot:
    """The snapshot as it would be once these tasks gave back their allocations."""
    return release_holdings(snapshot, (_holding(na) for t in tasks for na in t.allocation.nodes))


@dataclass(frozen=True, slots=True)
class _Fit:
    """Asks the placement engine whether a request fits a snapshot (under the cycle's policy)."""

    policy: str
    threshold: float
    mode: str = DEFAULT_THRESHOLD_MODE

    def __call__(self, snapshot: ClusterSnapshot, request: Request) -> bool:
        engine = PlacementEngine.from_name(snapshot, self.policy, threshold=self.threshold, mode=self.mode)
        return isinstance(engine.place(request), Placement)


Fits = _Fit
"""Whether a request fits a snapshot under a policy and threshold (what the leader and the simulator pass)."""


def _node_victims(node: NodeSnapshot, taken_at: float, request: Request, candidates: Sequence[Candidate],
                  fits: Callable[[ClusterSnapshot, Request], bool]) -> list[Candidate] | None:
    """The smallest set of candidates (in victim order) whose release lets one node take ``request``."""
    def fits_without(victims: Sequence[Candidate]) -> bool:
        return fits(ClusterSnapshot(nodes=(_without(node, (h for v in victims for h in v.holds
                                                           if h.node_id == node.node_id)),), taken_at_s=taken_at),
                    request)

    if fits_without(()):
        return []
    cands = sorted(candidates, key=_victim_order)[:_MAX_CANDIDATES]
    if not cands or not fits_without(cands):
        return None
    checks = 0
    for k in range(1, len(cands)):
        for combo in itertools.combinations(cands, k):
            checks += 1
            if checks > _MAX_CHECKS:
                return next(list(cands[:j]) for j in range(1, len(cands) + 1) if fits_without(cands[:j]))
            if fits_without(combo):
                return list(combo)
    return list(cands)


def choose_candidates(request: Request, snapshot: ClusterSnapshot, candidates: Iterable[Candidate],
                      fits: Callable[[ClusterSnapshot, Request], bool], *, now: float,
                      protection_s: float) -> list[Candidate] | None:
    """The victim-choice rule, pure: what to preempt so that ``request`` can be placed; ``[]`` when it already
    fits, None when no set of preemptible, strictly-lower-priority (than ``request.priority``), unprotected
    candidates (neither preempted within ``protection_s`` nor inside their own protected run time) would do. The
    leader (through :func:`choose_victims`) and the simulator both call it.

    :param request: the pending request (its ``priority`` is the preemptor's).
    :param snapshot: schedulable nodes, with what live allocations hold.
    :param candidates: running tasks that could be victims (the request's own id is skipped).
    :param fits: whether a request fits a snapshot (the placement engine under the policy in force).
    :param now: the current time (seconds, the clock ``started_s``/``last_preempted_s`` use).
    :param protection_s: a candidate preempted less than this long ago is never chosen.
    """
    if fits(snapshot, request):
        return []
    priority = request.priority
    per_node: dict[str, list[Candidate]] = {}
    for c in candidates:
        if c.priority >= priority or not c.preemptible or c.id == request.task_id:
            continue
        if c.last_preempted_s is not None and now - c.last_preempted_s < protection_s:
            continue
        if now < c.protected_until_s:
            continue   # inside its protected run time
        for h in c.holds:
            per_node.setdefault(h.node_id, []).append(c)
    if not per_node:
        return None
    one = replace(request, nodes=1)
    options: list[tuple[tuple, NodeSnapshot, list[Candidate]]] = []
    for node in snapshot.nodes:
        if request.nodes == 1 and node.node_id not in per_node:
            continue   # the request fits no node as it is (checked above): only a node with victims can help
        victims = _node_victims(node, snapshot.taken_at_s, one, per_node.get(node.node_id, ()), fits)
        if victims is not None:
            options.append(((len(victims), [_victim_order(v) for v in victims], node.node_id), node, victims))
    options.sort(key=lambda o: o[0])
    need = max(1, request.nodes)
    if len(options) < need:
        return None
    chosen = options[:need]
    victims = list({v.id: v for _k, _n, vs in chosen for v in vs}.values())
    if need > 1:   # the gang as a whole, on the chosen nodes with every victim released
        nodes = tuple(n for _k, n, _v in chosen)
        if not fits(release_holdings(ClusterSnapshot(nodes=nodes, taken_at_s=snapshot.taken_at_s),
                                     (h for v in victims for h in v.holds)), request):
            return None
    return victims


def choose_victims(task: types_pb2.Task, snapshot: ClusterSnapshot, running: Iterable[types_pb2.Task],
                   fits: Callable[[ClusterSnapshot, Request], bool], *, now: float,
                   protection_s: float) -> list[types_pb2.Task] | None:
    """The tasks to preempt so that ``task`` can be placed (:func:`choose_candidates` over stored tasks);
    ``[]`` when it already fits, None when no set would do.

    :param task: the pending task.
    :param snapshot: schedulable nodes, with what live allocations hold.
    :param running: tasks that could be victims (only RUNNING and PAUSED ones are; anything else is ignored).
    :param fits: whether a request fits a snapshot (the placement engine under the policy in force).
    :param now: the current time (unix seconds).
    :param protection_s: a task preempted less than this long ago is never chosen.
    """
    by_id = {t.id: t for t in running if TaskState(t.state) in _VICTIM_STATES}
    chosen = choose_candidates(request_for(task), snapshot, (candidate(t) for t in by_id.values()), fits,
                               now=now, protection_s=protection_s)
    return None if chosen is None else [by_id[c.id] for c in chosen]


def lowest_preemptible(running: Iterable[tuple[int, bool]]) -> int | None:
    """The lowest priority of the preemptible running work, of (priority, preemptible) pairs (None: none is
    preemptible): only a waiting request of a strictly higher priority can be helped (:func:`choose_preemption`)."""
    return min((priority for priority, preemptible in running if preemptible), default=None)


def choose_preemption(waiting: Iterable[Request], running: Sequence[Candidate], snapshot: Callable[[], ClusterSnapshot],
                      fits: Callable[[ClusterSnapshot, Request], bool], *, now: float, protection_s: float,
                      allowed: Callable[[Request, Candidate], bool] | None = None,
                      view: Callable[[Request, ClusterSnapshot], ClusterSnapshot] | None = None,
                      ) -> tuple[Request, list[Candidate]] | None:
    """A pass's preemption decision, the leader's and the simulator's: for the first waiting request in queue
    order (:func:`~coordinator.domain.queue_key`) that strictly-lower-priority preemptible work blocks, its victims
    (:func:`choose_candidates`); None when no waiting request can be helped.

    :param waiting: the requests left waiting.
    :param running: the candidates (running work).
    :param snapshot: builds the cluster as placement sees it (called once, only when a request may be helped).
    :param allowed: whether a request may take what a candidate holds (default: any).
    :param view: the snapshot as a request's placement may use it (default: as it is).
    """
    lowest = lowest_preemptible((c.priority, c.preemptible) for c in running)
    if lowest is None:
        return None
    helped = sorted((r for r in waiting if r.priority > lowest), key=queue_key)
    cluster = snapshot() if helped else None
    for req in helped:
        assert cluster is not None
        pool = running if allowed is None else [c for c in running if allowed(req, c)]
        victims = choose_candidates(req, view(req, cluster) if view is not None else cluster, pool, fits, now=now,
                                    protection_s=protection_s)
        if victims:
            return req, victims
    return None


@dataclass(slots=True)
class _Claim:
    """Victims being stopped for a preemptor, which lower-priority pending work must not overtake."""

    priority: int
    victims: tuple[str, ...]
    expires_s: float


class Preemptor:
    """The QoS Manager's preemption: chooses victims after a rejection and sees them back into the queue.

    Example::

        if await preemptor.after_rejections(rejected, policy="max-utilization", threshold=0.9):
            ...                                   # victims are being stopped; the task is placed later
        await preemptor.victim_stopped(task)      # the agent reported a PREEMPTED task ended

    :param tasks: the task table (state changes go through it).
    :param registry: the node table.
    :param snapshots: builds a fresh cycle snapshot.
    :param dispatcher: stop decisions with the checkpoint signal.
    :param events: the cluster event log (``preemption`` events).
    :param counter: ``gptrm_preemptions_total``.
    :param protection_s: a task is not preempted again within this many seconds.
    :param now: the clock (unix seconds).
    :param may_preempt: whether a pending task may take what a running task holds (with team queues: only
        within its own queue; across queues, only reclaim takes borrowed GPUs back).
    :param view: the snapshot as a pending task's placement may use it (reservations block the GPUs they keep
        for others' work), so that nothing is preempted for GPUs it could not take.
    """

    def __init__(self, tasks: TaskTable, registry: NodeRegistry, snapshots: SnapshotBuilder, dispatcher: Dispatcher,
                 events: EventBus, counter: Counter, protection_s: float = DEFAULT_PROTECTION_S,
                 now: Callable[[], float] = time.time,
                 may_preempt: Callable[[types_pb2.Task, types_pb2.Task], bool] = lambda task, victim: True,
                 view: Callable[[types_pb2.Task, ClusterSnapshot], ClusterSnapshot] = lambda task, snapshot: snapshot,
                 ) -> None:
        self._tasks, self._registry, self._snapshots, self._dispatcher = tasks, registry, snapshots, dispatcher
        self._view = view
        self._may_preempt = may_preempt
        self._events, self._counter, self._protection_s, self._now = events, counter, protection_s, now
        self._claims: dict[str, _Claim] = {}       # preemptor task id → its claim
        self._log = get_logger("qos")

    def _live_claims(self) -> dict[str, _Claim]:
        now = self._now()
        for tid, claim in list(self._claims.items()):
            task = self._tasks.find(tid)
            if task is None or task.state != TaskState.PENDING or claim.expires_s < now:
                del self._claims[tid]
        return self._claims

    def schedulable(self, pending: Sequence[types_pb2.Task]) -> list[types_pb2.Task]:
        """The pending tasks a cycle may place now: lower-priority ones wait while what a preemption frees is
        not yet taken by the preemptor — below a claim's priority, and, while any task is still PREEMPTED
        (also after a leader change, which forgets claims), below the highest pending priority."""
        claims = self._live_claims()
        floor = max((c.priority for c in claims.values()), default=None)
        if self._tasks.count_in(TaskState.PREEMPTED):
            top = max((t.spec.priority for t in pending), default=None)
            floor = top if floor is None or (top is not None and top > floor) else floor
        if floor is None:
            return list(pending)
        return [t for t in pending if t.spec.priority >= floor or t.id in claims]

    async def after_rejections(self, rejected: Sequence[types_pb2.Task], policy: str, threshold: float,
                               mode: str = DEFAULT_THRESHOLD_MODE) -> bool:
        """Preempt for the first rejected task (queue order) that strictly-lower-priority work blocks (one per
        cycle; :func:`choose_preemption`); True when victims are being stopped for it."""
        claims = self._live_claims()
        tasks = self._tasks.live()
        victims_of = {t.id: t for t in tasks if t.state in _VICTIM_STATES}
        # Most cycles that leave work waiting have no one to preempt for it: said before any candidate is built.
        lowest = lowest_preemptible((t.spec.priority, _preemptible(t)) for t in victims_of.values())
        if lowest is None:
            return False
        # Only a task above the lowest preemptible priority has anyone of strictly lower priority to preempt.
        waiting = {t.id: t for t in rejected if t.id not in claims and t.spec.priority > lowest}
        if not waiting:
            return False
        running = [candidate(t) for t in victims_of.values()]
        # What PREEMPTED tasks hold is on its way back: plan as if it were free already.
        chosen = choose_preemption(
            [request_for(t) for t in waiting.values()], running,
            lambda: release_tasks(self._snapshots.snapshot(tasks, self._registry),
                                  (t for t in tasks if t.state == TaskState.PREEMPTED)),
            _Fit(policy, threshold, mode),
            now=self._now(), protection_s=self._protection_s,
            allowed=lambda req, c: self._may_preempt(waiting[req.task_id], victims_of[c.id]),
            view=lambda req, snap: self._view(waiting[req.task_id], snap))
        if chosen is None:
            return False
        req, victims = chosen
        await self._preempt(waiting[req.task_id], [victims_of[c.id] for c in victims])
        return True

    async def _preempt(self, task: types_pb2.Task, victims: list[types_pb2.Task]) -> None:
        prio = task.spec.priority
        stopped, grace = await self._stop(victims, f"Preempted by task {task.id}, of priority {prio}, which needs "
                                                    f"the GPUs this task held.", task.id)
        if not stopped:
            return
        self._claims[task.id] = _Claim(prio, tuple(stopped), self._now() + 2 * grace + _CLAIM_SLACK_S)
        nodes = sorted({na.node_id for v in victims if v.id in stopped for na in v.allocation.nodes})
        self._log.info("tasks_preempted", task_id=task.id, priority=prio, victims=",".join(stopped),
                       nodes=",".join(nodes))
        self._events.publish("preemption", f"task {task.id} (priority {prio}) preempts {', '.join(stopped)} on "
                             f"{', '.join(nodes)}", task_id=task.id, preemptor=task.id, victims=",".join(stopped),
                             reason=f"{task.id} cannot be placed while lower-priority work holds "
                             f"{', '.join(nodes)}")
        self._tasks.note_reason(task.id, f"Waiting for {len(stopped)} preempted task(s) to stop: "
                                         f"{', '.join(stopped)}.")

    async def _stop(self, victims: Sequence[types_pb2.Task], reason: str, by: str) -> tuple[list[str], float]:
        """Move the victims to PREEMPTED, all in one fenced write, and stop each with its checkpoint signal; the
        ids stopped and the longest stop grace among them.

        All or none: a leader that stopped between two victims' writes would leave the others running, and its
        successor, which does not know the claim, would give the GPUs freed back to the victim itself (then
        protected from a second preemption) instead of to the preemptor. When one of them changed meanwhile
        (ended, or a write of it on its way) nothing is preempted; the next cycle decides again on the tasks
        as they are then."""
        try:
            stored = await self._tasks.transition_together([(v.id, {"preemptions": v.preemptions + 1})
                                                            for v in victims], TaskState.PREEMPTED, reason)
        except GptrmError as e:
            self._log.info("preemption_victims_changed", preemptor=by, victims=",".join(v.id for v in victims),
                           reason=str(e))
            return [], 0.0
        grace = 0.0
        for task in stored:
            signal = task.spec.checkpoint_signal or DEFAULT_CHECKPOINT_SIGNAL
            self._dispatcher.stop(task, reason, checkpoint_signal=signal)
            grace = max(grace, task.spec.stop_grace_s or 10.0)
            self._counter.inc()
        return [t.id for t in stored], grace

    async def reclaim(self, victims: Sequence[types_pb2.Task], queue: str) -> list[str]:
        """Take back GPUs that ``victims`` (other queues' tasks, on borrowed GPUs) hold for ``queue``, which is
        owed them within its quota: the same stop as a preemption (checkpoint signal, grace, back in the
        queue). Returns the ids stopped."""
        if not victims:
            return []
        reason = (f"Preempted: reclaimed by queue {queue}, which needs the GPUs it lent for its own work within "
                  f"its quota.")
        stopped, _grace = await self._stop(victims, reason, queue)
        if stopped:
            self._log.info("tasks_reclaimed", queue=queue, victims=",".join(stopped))
            self._events.publish("preemption", f"queue {queue} reclaims its quota from {', '.join(stopped)}",
                                 queue=queue, victims=",".join(stopped),
                                 reason=f"queue {queue} has work waiting within its quota")
        return stopped

    async def victim_stopped(self, task: types_pb2.Task) -> types_pb2.Task:
        """A PREEMPTED task ended on its agents: back in the queue (``PENDING``), its reservations released."""
        back = (f"{task.reason} It stopped and waits in its queue to run again." if task.reason.endswith(".")
                else f"{task.reason}; back in the queue")
        return await self._tasks.transition(task.id, TaskState.PENDING, back, release=True)
