"""Team queues in the scheduling cycle: which pending tasks a cycle may place, in what order, and
what a queue owed its quota takes back.

The rules are :mod:`coordinator.queues`'s (pure); this module turns the cycle's tasks into their
plain inputs and applies the answers. :func:`plan_queues` is what the leader's cycle and the
simulator both call:

1. the pending tasks, already sorted as the scheduler always sorts them (priority, deadline
   slack, submit time), are interleaved across queues by weighted dominant share with decayed
   past usage (:func:`~coordinator.queues.order_pending`); within a queue their order is kept;
2. in that order each task is admitted or not (:func:`~coordinator.queues.admit`): within its
   queue's quota, or within its limit by borrowing what others lend; what it borrows is recorded,
   and counted in its queue's use for the tasks after it in the same cycle. Quota comes first:
   a first round over the fair order admits the tasks that fit within their queue's quota, and a
   second round, in the same order, those that borrow, so a queue's idle quota is never lent in a
   cycle in which its own tasks ask for it. (Lending it first let a borrower earlier in fair
   order take the GPUs that reclaim had just freed for the lender, and reclaim took them again
   the next cycle, without end.) In the second round, tasks of queues holding less than their
   quota (a task larger than what is left of it) borrow first: a team whose jobs are larger than
   its quota is served ahead of teams already over theirs, and the GPUs its reclaim freed for it
   (:mod:`coordinator.queues.reclaim`, the partial claim) are not borrowed away by them. The plan's
   order is the fair order of all admitted tasks;
3. a queue past its budget gates its new work: ``hold`` refuses it, ``lowest`` puts it after
   everyone else's.

Admission is monotone within a cycle: what the cycle admits only adds to the queues' use, and more
use never turns a refusal into an admission (more held means less under quota and limit, less
idle quota to lend, more already borrowed). So a demand refused once is refused for every later
task of the cycle asking exactly the same (queue, model, GPUs, cores, memory) without asking
admission again; its reason is the first refusal's. With thousands of waiting tasks of a few
shapes (a replayed trace, a backlog) this keeps a cycle near one admission per distinct demand.

A task counts whole GPUs: ``ceil(gpus per node) × nodes`` (a shared fraction of a GPU counts as
one; quotas are in GPUs, as operators write them).

Without configured queues nothing changes: every pending task is admitted, in the order given.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from common.pb.gptrm.v1 import types_pb2
from common.types import NodeState, TaskState
from coordinator.monitor.nodes import NodeRegistry
from coordinator.power_states import power_label
from coordinator.queues import (
    ANY_MODEL,
    DEFAULT_QUEUE,
    AdmissionDecision,
    BudgetState,
    Demand,
    Gate,
    Held,
    Pending,
    QueueConfig,
    QueueHolding,
    QueueUse,
    UsageDecay,
    Victim,
    admit,
    budget_gate,
    order_pending,
    queue_use,
    rebalance,
    reclaim_victims,
    room,
)
from coordinator.run_limits import protected
from coordinator.state import LeaderState

__all__ = ["HOLDING_STATES", "LeaderQueues", "QueuePlan", "QueueRoom", "QueuedTask", "holding_of", "plan_queues",
           "preempts_within", "queue_of", "queued", "reclaim_for", "shrink_needed"]

HOLDING_STATES = (TaskState.SCHEDULED, TaskState.STARTING, TaskState.RUNNING, TaskState.PAUSED, TaskState.PREEMPTED)
"""States in which a task holds GPUs (a PREEMPTED task until its agent reports it stopped)."""
_GIB = float(1 << 30)
_WAKEABLE = ("off", "powering-on")


@dataclass(frozen=True, slots=True)
class QueuedTask:
    """A pending task as the queues see it."""

    task_id: str
    queue: str
    gpus: int
    cpu: float = 0.0
    mem_gib: float = 0.0
    gpu_model: str = ANY_MODEL
    per_node: int = 0           # whole GPUs it needs on each of node_count nodes (0: unknown)
    node_count: int = 1


@dataclass
class QueuePlan:
    """What a cycle may place: ``order`` (task ids, admitted, in the order to try), each one's
    :class:`~coordinator.queues.AdmissionDecision`, and the ``refused`` ones with the reason."""

    order: list[str]
    admissions: dict[str, AdmissionDecision] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)
    use: dict[str, QueueUse] = field(default_factory=dict)
    """What each queue holds once the admitted tasks run (its running tasks' GPUs and the plan's)."""


def queue_of(task: types_pb2.Task) -> str:
    """The queue a task runs in (tasks from before queues run in the default queue)."""
    return task.queue or DEFAULT_QUEUE.name


def preempts_within(config: QueueConfig, queue: str, victim_queue: str) -> bool:
    """Whether a task of ``queue`` may preempt one of ``victim_queue`` for priority: once queues are configured,
    only within its own queue (across queues, only reclaim takes borrowed GPUs back)."""
    return not config.managed or queue == victim_queue


def counted_gpus(gpus_per_node: float, nodes: int) -> int:
    """The whole GPUs a queue counts for a demand of ``gpus_per_node`` on each of ``nodes`` nodes: a shared
    fraction of a GPU counts as one (quotas are in GPUs). The one rule, for the leader's tasks
    (:func:`whole_gpus`) and the simulator's requests."""
    return math.ceil(gpus_per_node - 1e-9) * max(1, nodes) if gpus_per_node > 0 else 0


def whole_gpus(task: types_pb2.Task) -> int:
    """The whole GPUs a task asks for over all its nodes (:func:`counted_gpus`)."""
    return counted_gpus(task.demand.gpus, task.spec.nodes)


def queued(task: types_pb2.Task) -> QueuedTask:
    """A pending task's queue view."""
    n = max(1, task.spec.nodes)
    gpus = whole_gpus(task)
    return QueuedTask(task.id, queue_of(task), gpus, task.demand.cpu_cores * n,
                      task.demand.mem_bytes * n / _GIB, task.spec.constraints.gpu_model or ANY_MODEL,
                      gpus // n, n)


def holding_of(task: types_pb2.Task, registry: NodeRegistry, now: float | None = None) -> QueueHolding:
    """A placed task's holding: its GPUs (of the model of its rank-0 node's first GPU), borrowed count as
    stored at placement (:func:`~coordinator.queues.rebalance` recomputes it). Given ``now``, a task inside its
    protected run time counts as not preemptible (reclaim never picks it)."""
    gpus, model = 0, ANY_MODEL
    per_node: dict[str, int] = {}
    for na in task.allocation.nodes:
        on_node = len(na.gpu_indices) or math.ceil(na.demand.gpus - 1e-9)
        gpus += on_node
        per_node[na.node_id] = per_node.get(na.node_id, 0) + on_node
        if model == ANY_MODEL and na.gpu_indices:
            entry = registry.get(na.node_id)
            if entry is not None:
                by_index = {g.index: g.model for g in entry.inventory.gpus}
                model = by_index.get(na.gpu_indices[0], "") or ANY_MODEL
    n = max(1, len(task.allocation.nodes))
    return QueueHolding(task.id, queue_of(task), model, gpus, min(task.borrowed_gpus, gpus),
                        (task.spec.preemptible if task.spec.HasField("preemptible") else True)
                        and (now is None or not protected(task, now)),
                        task.allocation.created_unix_s or task.submit_unix_s,
                        task.demand.cpu_cores * n, task.demand.mem_bytes * n / _GIB, per_node)


def _add(use: dict[str, QueueUse], queue: str, pool: str, task: QueuedTask, borrowed: int) -> None:
    old = use.get(queue, QueueUse())
    gpus = dict(old.gpus)
    gpus[pool] = gpus.get(pool, Held()) + Held(task.gpus - borrowed, borrowed)
    use[queue] = QueueUse(gpus=gpus, cpu=old.cpu + task.cpu, mem_gib=old.mem_gib + task.mem_gib)


def plan_queues(config: QueueConfig, pending: Sequence[QueuedTask], holdings: Sequence[QueueHolding],
                capacity: Mapping[str, int], decay: UsageDecay, now: float,
                gates: Mapping[str, Gate] | None = None) -> QueuePlan:
    """The module's steps 1-3 over plain values.

    :param pending: the pending tasks in the scheduler's order.
    :param holdings: every task holding GPUs.
    :param capacity: the cluster's GPUs per concrete model.
    :param decay: each queue's decayed past usage.
    :param gates: each queue's budget gate (``run`` when absent).
    """
    if not config.managed:
        return QueuePlan([t.task_id for t in pending])
    by_id = {t.task_id: t for t in pending}
    plan = QueuePlan([])
    known = []
    leaf: dict[str, bool] = {}
    for t in pending:
        if t.queue not in leaf:
            leaf[t.queue] = t.queue in config and config.is_leaf(t.queue)
        if leaf[t.queue]:
            known.append(t)
        elif t.queue in config:
            plan.refused[t.task_id] = (f"Queue {t.queue} has child queues and takes no tasks, so this task cannot "
                                       f"start; cancel it and submit it to one of those queues.")
        else:
            plan.refused[t.task_id] = (f"Queue {t.queue} does not exist, so this task cannot start; cancel it and "
                                       f"submit it to a queue that exists.")
    use = dict(queue_use(rebalance(config, holdings)))
    order = order_pending(config, [Pending(t.task_id, t.queue, t.gpus, t.cpu) for t in known], use, decay,
                          capacity, now)
    # Within a cycle use only grows, and admission never admits a demand on more use than it refused
    # it on: a refused demand is refused again for every later task asking exactly the same, and one
    # that had to borrow still has to (or is refused).
    refused: dict[tuple[str, str, int, float, float], str] = {}
    borrows: dict[tuple[str, str, int, float, float], str] = {}     # demand → the pool it borrows in
    ahead: list[str] = []                              # borrowing from under their queue's quota
    later: list[str] = []

    def under_quota(queue: str, pool: str) -> bool:
        return use.get(queue, QueueUse()).held_in(config, pool).total < config.get(queue).quota_in(pool)

    for task_id in order:                              # first round: within quota only
        t = by_id[task_id]
        if (gates or {}).get(t.queue, "run") == "hold":
            plan.refused[task_id] = (f"Queue {t.queue} is past its budget, so its new work is held until the "
                                     f"budget's next period.")
            continue
        key = (t.queue, t.gpu_model, t.gpus, t.cpu, t.mem_gib)
        if key in refused:
            plan.refused[task_id] = refused[key]
            continue
        if key in borrows:
            (ahead if under_quota(t.queue, borrows[key]) else later).append(task_id)
            continue
        decision = admit(config, use, capacity, Demand(*key))
        if not decision.admit:
            plan.refused[task_id] = refused[key] = decision.reason
        elif decision.borrowed:
            borrows[key] = decision.pool
            (ahead if under_quota(t.queue, decision.pool) else later).append(task_id)
        else:
            _add(use, t.queue, decision.pool, t, 0)
            plan.admissions[task_id] = decision
    for task_id in (*ahead, *later):                   # second round: borrowing what is still lent
        t = by_id[task_id]
        key = (t.queue, t.gpu_model, t.gpus, t.cpu, t.mem_gib)
        if key in refused:
            plan.refused[task_id] = refused[key]
            continue
        decision = admit(config, use, capacity, Demand(*key))
        if not decision.admit:
            plan.refused[task_id] = refused[key] = decision.reason
            continue
        _add(use, t.queue, decision.pool, t, decision.borrowed)
        plan.admissions[task_id] = decision
    plan.use = use
    admitted = [task_id for task_id in order if task_id in plan.admissions]
    lowest = {task_id for task_id in admitted if (gates or {}).get(by_id[task_id].queue, "run") == "lowest"}
    plan.order = [task_id for task_id in admitted if task_id not in lowest]
    plan.order += [task_id for task_id in admitted if task_id in lowest]
    return plan


class QueueRoom:
    """What elastic tasks of each queue may still take in a cycle: :func:`~coordinator.queues.room` (the queue's idle
    quota and what it may borrow, within its limits) over what the queues hold, booked as tasks take it so that two
    tasks never grow into the same GPUs of the pool.

    :param config: the queue tree.
    :param use: what each queue holds (a copy is kept).
    :param capacity: the cluster's GPUs per concrete model.
    """

    def __init__(self, config: QueueConfig, use: Mapping[str, QueueUse], capacity: Mapping[str, int]) -> None:
        self._config, self._use, self._capacity = config, dict(use), capacity

    def of(self, queue: str, pool: str) -> int:
        """GPUs ``queue`` may still take in ``pool`` (0 for a queue that is not a leaf of the tree)."""
        if queue not in self._config or not self._config.is_leaf(queue):
            return 0
        return room(self._config, self._use, self._capacity, queue, pool)

    def take(self, queue: str, pool: str, gpus: int) -> int:
        """Book ``gpus`` more GPUs for ``queue`` in ``pool``; returns how many of them it borrows."""
        if gpus <= 0 or queue not in self._config:
            return 0
        old = self._use.get(queue, QueueUse())
        held = old.held_in(self._config, pool).total
        own = max(0, min(gpus, self._config.get(queue).quota_in(pool) - held))
        per_model = dict(old.gpus)
        per_model[pool] = per_model.get(pool, Held()) + Held(own, gpus - own)
        self._use[queue] = QueueUse(gpus=per_model, cpu=old.cpu, mem_gib=old.mem_gib)
        return gpus - own


def shrink_needed(config: QueueConfig, use: Mapping[str, QueueUse], capacity: Mapping[str, int], task: QueuedTask,
                  pool: str, most: int) -> int | None:
    """The fewest GPUs a queue's running elastic tasks in ``pool`` must give back for its waiting ``task`` to be
    admitted (the queue then holds that much less there, borrowed GPUs first); None when ``task`` is admitted
    without it, is not a task of a leaf queue, or even ``most`` GPUs would not do (its queue's cores or memory,
    a budget, another pool)."""
    if task.queue not in config or not config.is_leaf(task.queue) or most <= 0:
        return None
    model = pool if pool != ANY_MODEL else task.gpu_model
    demand = Demand(task.queue, model, task.gpus, task.cpu, task.mem_gib)
    if admit(config, use, capacity, demand).admit:
        return None
    old = use.get(task.queue, QueueUse())
    held = old.held_in(config, pool)
    others = {m: h for m, h in old.gpus.items() if config.pool_of(m) != pool}
    for give in range(1, min(most, held.total) + 1):
        borrowed = max(0, held.borrowed - give)
        own = held.own - max(0, give - held.borrowed)
        less = dict(use)
        less[task.queue] = QueueUse(gpus={**others, pool: Held(own, borrowed)}, cpu=old.cpu, mem_gib=old.mem_gib)
        if admit(config, less, capacity, demand).admit:
            return give
    return None


def reclaim_for(config: QueueConfig, waiting: Iterable[QueuedTask], holdings: Sequence[QueueHolding],
                stopping: Sequence[QueueHolding] = (), idle: Mapping[str, int] | None = None,
                idle_by_node: Mapping[str, tuple[str, int]] | None = None) -> list[Victim]:
    """Tasks to preempt so that the ``waiting`` tasks (in fair order) get back the quota others borrow.

    :param holdings: the tasks holding GPUs that could be victims.
    :param stopping: PREEMPTED tasks: their GPUs are on their way back and count as free, so a claim is
        not served twice while its victims stop.
    :param idle: GPUs per model that no task holds: they count as free too, so nothing is preempted for
        a demand that idle GPUs already cover (it waits for placement, e.g. on fragmented nodes); by
        default, ``idle_by_node`` summed per model.
    :param idle_by_node: node → (GPU model, GPUs no task holds there): claims are then made node by node
        (a task that needs 8 GPUs on one node, or whole nodes for a gang, gets victims on nodes it can use;
        :func:`~coordinator.queues.reclaim_victims`); the stopping tasks' GPUs count on their nodes.
    """
    if not config.managed:
        return []
    free: dict[str, int] = dict(idle or {})
    if idle is None and idle_by_node is not None:
        for model, n in idle_by_node.values():
            free[model] = free.get(model, 0) + n
    for h in stopping:
        free[h.gpu_model] = free.get(h.gpu_model, 0) + h.gpus
    by_node: dict[str, tuple[str, int]] | None = None
    if idle_by_node is not None:
        by_node = dict(idle_by_node)
        for h in stopping:
            for node, gpus in h.nodes.items():
                if node in by_node:
                    by_node[node] = (by_node[node][0], by_node[node][1] + gpus)
    demands = [Demand(t.queue, t.gpu_model, t.gpus, t.cpu, t.mem_gib, t.per_node, t.node_count) for t in waiting
               if t.queue in config and config.is_leaf(t.queue)]
    return reclaim_victims(config, rebalance(config, holdings), demands, free, by_node)


class LeaderQueues:
    """The leader's side of the queues: builds :func:`plan_queues`'s and :func:`reclaim_for`'s inputs from
    the leader state and keeps each queue's decayed usage.

    :param state: the leader's state (tasks and the queue tree).
    :param registry: the node table (GPU capacity and models).
    :param clock: unix seconds.
    """

    def __init__(self, state: LeaderState, registry: NodeRegistry, clock: Callable[[], float] = time.time) -> None:
        self._state, self._registry, self.clock = state, registry, clock
        self.decay = UsageDecay.for_config(state.queues)
        self.budgets: dict[str, BudgetState] = {}
        """Each budgeted queue's last budget reading (``coordinator.queues.admin.QueueAdmin.check_budgets``)."""
        self._accrued_at: float | None = None
        self.shielded: Callable[[types_pb2.Task], bool] = lambda task: False
        """Whether a task may not be reclaimed whatever it borrows (a reservation's own work on its GPUs)."""

    @property
    def config(self) -> QueueConfig:
        """The queue tree in force."""
        return self._state.queues

    def capacity(self) -> dict[str, int]:
        """The cluster's GPUs per model (every node not LOST)."""
        out: dict[str, int] = {}
        for entry in self._registry:
            if entry.state == NodeState.LOST:
                continue
            for g in entry.inventory.gpus:
                model = g.model or ANY_MODEL
                out[model] = out.get(model, 0) + 1
        return out

    def holdings(self) -> tuple[list[QueueHolding], list[QueueHolding]]:
        """(tasks holding GPUs that could be victims, PREEMPTED tasks on their way out)."""
        holding: list[QueueHolding] = []
        stopping: list[QueueHolding] = []
        now = self.clock()
        for t in self._state.tasks.values():
            if t.state in HOLDING_STATES and t.allocation.nodes:
                held = holding_of(t, self._registry, now)
                if t.state == TaskState.PREEMPTED:
                    stopping.append(held)
                else:
                    holding.append(replace(held, preemptible=False) if held.preemptible and self.shielded(t)
                                   else held)
        return holding, stopping

    def restore(self, decay: UsageDecay, accounted_until: float) -> None:
        """Continue from ``decay`` (rebuilt from the usage ledger up to ``accounted_until``)."""
        self.decay, self._accrued_at = decay, accounted_until

    def accrue(self) -> None:
        """Add the GPU- and core-seconds each queue held since the last call to its decayed usage."""
        now = self.clock()
        if self.decay.half_life_s != self.config.half_life_h * 3600.0:
            self.decay = UsageDecay.for_config(self.config)
        last, self._accrued_at = self._accrued_at, now
        if last is None or now <= last:
            return
        held, stopping = self.holdings()
        for h in (*held, *stopping):
            self.decay.add(h.queue, now, gpu_s=h.gpus * (now - last), cpu_s=h.cpu * (now - last))

    def releasing(self, task: types_pb2.Task) -> None:
        """``task`` gives up its GPUs now (it ended or goes back to the queue): what it held since the last
        :meth:`accrue` is added to its queue's decayed usage, which the next :meth:`accrue` (it no longer holds
        anything then) would miss; so a task counts up to its end, not up to the last cycle before it."""
        last = self._accrued_at
        if last is None or not self.config.managed or task.state not in HOLDING_STATES or not task.allocation.nodes:
            return
        now = self.clock()
        if now <= last:
            return
        held = holding_of(task, self._registry, now)
        self.decay.add(held.queue, now, gpu_s=held.gpus * (now - last), cpu_s=held.cpu * (now - last))

    def gates(self, pending: Sequence[QueuedTask]) -> dict[str, Gate]:
        """Each queue's budget gate for a cycle with these pending tasks (only queues past a budget appear)."""
        config = self.config
        waiting = {t.queue for t in pending}
        out: dict[str, Gate] = {}
        for name, state in self.budgets.items():
            if name in config and state.fraction >= 1.0:
                gate = budget_gate(config.get(name), state, others_waiting=bool(waiting - {name}))
                if gate != "run":
                    out[name] = gate
        return out

    def plan(self, pending: Sequence[types_pb2.Task]) -> QueuePlan:
        """:func:`plan_queues` for the cycle's pending tasks (in the scheduler's order)."""
        held, stopping = self.holdings()
        queued_tasks = [queued(t) for t in pending]
        return plan_queues(self.config, queued_tasks, held + stopping, self.capacity(), self.decay, self.clock(),
                           self.gates(queued_tasks))

    def reclaim(self, waiting: Sequence[types_pb2.Task]) -> list[Victim]:
        """:func:`reclaim_for` for the tasks a cycle left waiting (in fair order); GPUs no task holds count
        as free (:meth:`idle`)."""
        held, stopping = self.holdings()
        return reclaim_for(self.config, [queued(t) for t in waiting], held, stopping,
                           idle_by_node=self.idle_by_node())

    def idle_by_node(self) -> dict[str, tuple[str, int]]:
        """Node → (its GPU model, GPUs no task holds there), for the nodes work may get: schedulable ones,
        and those the Resource Adaptor powered off or is waking (it wakes one for a task that needs it).
        Cordoned, draining, unready and lost nodes are left out, so they never stop a reclaim."""
        out: dict[str, tuple[str, int]] = {}
        for entry in self._registry:
            if not entry.inventory.gpus or not (self._registry.schedulable(entry)
                                                or power_label(entry.record.power_state) in _WAKEABLE):
                continue
            taken = set(entry.reservation.gpu_indices)
            model = entry.inventory.gpus[0].model or ANY_MODEL
            out[entry.node_id] = (model, sum(1 for g in entry.inventory.gpus if g.index not in taken))
        return out

    def use(self) -> dict[str, QueueUse]:
        """What each queue's placed tasks hold now (``borrowed`` recomputed), PREEMPTED ones included."""
        held, stopping = self.holdings()
        return queue_use(rebalance(self.config, held + stopping))

    def room(self, use: Mapping[str, QueueUse] | None = None) -> QueueRoom:
        """What elastic tasks of each queue may grow into (:class:`QueueRoom`), over ``use`` (default: what the
        queues' placed tasks hold now)."""
        return QueueRoom(self.config, self.use() if use is None else use, self.capacity())

    def pool_of_task(self, task: types_pb2.Task) -> str:
        """The GPU pool a placed task's GPUs are in."""
        return self.config.pool_of(holding_of(task, self._registry).gpu_model)

    def may_preempt(self, task: types_pb2.Task, victim: types_pb2.Task) -> bool:
        """Priority preemption stays within a queue once queues are configured (reclaim crosses them)."""
        return preempts_within(self.config, queue_of(task), queue_of(victim))
