"""Team queues in the replay, decided by the scheduler's own queue code.

With ``SimConfig(queues=config)`` every scheduling pass of the
:class:`~coordinator.simulator.engine.Simulator` goes through :class:`SimQueues`, which does what
the leader's cycle does (:mod:`coordinator.scheduler.cycle`), over the replay's jobs instead of
the task table:

1. The pending jobs, in the engine's queue order (:func:`coordinator.domain.queue_key`), become
   :class:`~coordinator.queues.planning.QueuedTask` values (queue from :attr:`SimJob.queue`,
   whole GPUs ``ceil(gpus per node) × nodes``), the running jobs become
   :class:`~coordinator.queues.QueueHolding` values (their queue, GPUs, the ``borrowed`` count their
   admission gave them, preemptible, start time), and
   :func:`~coordinator.queues.planning.plan_queues` decides admission and fair order against the
   cluster's GPUs per model and the queues' decayed usage. Only the plan's ``order`` is offered to
   placement, in that order (each request held to its admitted GPU pool by
   :func:`coordinator.scheduler.pipeline.on_pool`); refused jobs wait.
2. Placement decides what ``place_batch`` over that order would (in the order, or for the policies
   that sort, by descending compute demand unless ``keep_order``). Between releases reservations
   only grow, so a shape the placement engine refused stays refused until something is released:
   the engine's cross-pass refusal set is kept (it holds placement refusals only, never queue
   refusals, which the plan decides afresh each pass). ``exact_batches`` hands the ordered requests
   to ``place_batch`` itself; the tests compare both. A job placed on GPUs of another pool than the
   one it was admitted in waits, its GPUs given back to the rest of the pass (the pipeline's rule, as in the
   leader).
3. With ``reclaim``, after the pass :func:`~coordinator.queues.planning.reclaim_for` runs over
   the jobs left waiting (the plan's order, then its refused ones) and the running jobs, with the
   GPUs no running job holds as idle (as the leader passes them); its
   victims are preempted the way :mod:`coordinator.simulator.qos` preempts (they stop at once, lose
   their progress and go back to the queue with their original request, running their whole
   duration again later: restart from scratch, no checkpoint modelled), then one more pass runs, as
   the leader's next cycle would, with the jobs of the queues that reclaimed placed first (a reclaim's
   claim: :class:`~coordinator.scheduler.pipeline.PlacementInputs`).

Decayed usage (:class:`~coordinator.queues.UsageDecay`) advances in virtual time: the GPU- and
core-seconds each queue's running jobs held are added whenever a job stops and before every plan,
so nothing held between two passes is missed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

from coordinator.domain import Placement, Request
from coordinator.elastic.rules import placement_gpus
from coordinator.queues import ANY_MODEL, QueueConfig, QueueHolding, QueueUse, UsageDecay, queue_use, rebalance
from coordinator.queues.planning import QueuedTask, QueuePlan, counted_gpus, preempts_within, reclaim_for
from coordinator.scheduler.pipeline import PendingTask, PlacementInputs, QueueState, plan_placements
from coordinator.simulator.ports import Replay

__all__ = ["SimQueues", "whole_gpus"]

_GIB = float(1 << 30)


def whole_gpus(request: Request) -> int:
    """The whole GPUs a request asks for over all its nodes, as the queues count them
    (:func:`~coordinator.queues.planning.counted_gpus`)."""
    return counted_gpus(request.demand.gpus, request.nodes)


class SimQueues:
    """Team queues inside one replay (owned by the simulator; module docstring).

    :param sim: the replay whose passes it runs.
    :param config: the queue tree.
    :param reclaim: preempt borrowers for queues owed their quota.
    :param preempt: stops a job the way preemption does (:meth:`coordinator.simulator.qos.SimPreemption.preempt`).
    """

    def __init__(self, sim: Replay, config: QueueConfig, *, reclaim: bool,
                 preempt: Callable[[int, float], None]) -> None:
        self.sim = sim
        self.preempt = preempt
        self.config = config
        self.reclaim = reclaim
        self.decay = UsageDecay.for_config(config)
        self.capacity: dict[str, int] = {}
        self.node_model: list[str] = []
        for node in sim.base.nodes:
            model = node.gpu_model or ANY_MODEL
            self.node_model.append(model)
            if node.capacity.gpus > 0:
                self.capacity[model] = self.capacity.get(model, 0) + int(node.capacity.gpus)
        # Each job's queue view, from the request it is first placed with (an elastic job's: its first size).
        self.tasks = [QueuedTask(r.task_id, j.queue, whole_gpus(r), r.demand.cpu_cores * r.nodes,
                                 r.demand.mem_bytes * r.nodes / _GIB, r.gpu_model or ANY_MODEL,
                                 whole_gpus(r) // r.nodes, r.nodes)
                      for j, r in ((j, sim.request(k)) for k, j in enumerate(sim.jobs))]
        self.by_id = {t.task_id: k for k, t in enumerate(self.tasks)}
        self.borrowed: dict[int, int] = {}     # running job → GPUs borrowed, as admitted
        self.model: dict[int, str] = {}        # running job → GPU model it holds
        self.gpus: dict[int, int] = {}         # running job → whole GPUs it holds (an elastic job's: its size)
        self.plan: QueuePlan | None = None     # the last pass's plan
        self.claims: frozenset[str] = frozenset()   # queues that reclaimed for the next pass (their jobs go first)
        self.accrued_at: float | None = None
        self.passes = 0
        self.reclaims = 0

    def _accrue(self, now: float) -> None:
        """Add what each queue's running jobs held since the last call to its decayed usage."""
        last, self.accrued_at = self.accrued_at, now
        if last is None or now <= last:
            return
        dt = now - last
        for k in self.sim.placed:
            t = self.tasks[k]
            self.decay.add(t.queue, now, gpu_s=self.gpus.get(k, t.gpus) * dt, cpu_s=t.cpu * dt)

    def released(self, k: int, now: float) -> None:
        """Job ``k`` stops holding its GPUs at ``now`` (ended or preempted); called before it is released."""
        self._accrue(now)
        self.borrowed.pop(k, None)
        self.model.pop(k, None)
        self.gpus.pop(k, None)

    def holdings(self) -> list[QueueHolding]:
        """The running jobs as the queues see them."""
        sim = self.sim
        out = []
        for k in sim.placed:
            t = self.tasks[k]
            gpus = self.gpus[k]
            per_node: dict[str, int] = {}
            for a in sim.placed[k].assignments:
                per_node[a.node_id] = per_node.get(a.node_id, 0) + (len(a.gpu_indices) or t.per_node)
            out.append(QueueHolding(t.task_id, t.queue, self.model[k], gpus, min(self.borrowed[k], gpus), True,
                                    sim.start_times[k], t.cpu, t.mem_gib, per_node))
        return out

    def state(self, now: float) -> QueueState:
        """The queues as a pass plans them (their usage accrued up to ``now``)."""
        self.passes += 1
        self._accrue(now)
        return QueueState(self.config, self.holdings(), self.capacity, self.decay)

    def claimed(self) -> frozenset[str]:
        """The queues whose reclaim's victims stopped since the last pass: this pass places their jobs first (the
        victims stopped at once, so it has their GPUs)."""
        claims, self.claims = self.claims, frozenset()
        return claims

    def queued(self, k: int) -> QueuedTask:
        """Job ``k`` as its queue sees it."""
        return self.tasks[k]

    def schedule(self, now: float, only: Sequence[int] | None = None) -> None:
        """One pass: the pipeline's :func:`~coordinator.scheduler.pipeline.plan_placements` over the pending jobs
        (``only``: these alone) and the queues' state (admission, fair order, placement), then the placed jobs start
        (module docstring, steps 1-2)."""
        sim = self.sim
        pending = sim.pending() if only is None else only
        plan = plan_placements(PlacementInputs(
            now, [PendingTask(sim.request(k), self.tasks[k]) for k in pending], engine_for=lambda _: sim.engine,
            queues=self.state(now), place=sim.place, claims=self.claimed()))
        self.plan = plan.queues
        for d in plan.decisions:
            if isinstance(d, Placement):
                k = self.by_id[d.task_id]
                sim.book(k, d, now)
                self.booked(k, d)
                sim.start(k, d, now, sim.jobs[k].duration_s)

    def booked(self, k: int, placement: Placement, beyond: int = 0) -> None:
        """Job ``k`` was booked on ``placement`` (in the GPU pool it was admitted in by :attr:`plan`) with what its
        admission borrowed, and ``beyond``: what an elastic job borrows above its first size."""
        admission = self.plan.admissions[self.tasks[k].task_id] if self.plan is not None else None
        assert admission is not None
        self.borrowed[k] = admission.borrowed + beyond
        self.model[k] = self.node_model[self.sim.index[placement.node_ids[0]]]
        self.gpus[k] = max(self.tasks[k].gpus, placement_gpus(placement))

    def left_waiting(self) -> list[int]:
        """The jobs the last pass's plan admitted and placement left waiting, in its order (what priority
        preemption may help: a job its queue refused waits for its queue, not for GPUs)."""
        if self.plan is None:
            return []
        placed = self.sim.placed
        return [k for task_id in self.plan.order if (k := self.by_id[task_id]) not in placed]

    def refused(self) -> Mapping[int, str]:
        """Job → why its queue refused it in the last pass's plan, in fair order."""
        return {} if self.plan is None else {self.by_id[t]: why for t, why in self.plan.refused.items()}

    def may_preempt(self, k: int, victim: int) -> bool:
        """Whether job ``k`` may preempt job ``victim`` for priority (:func:`preempts_within`)."""
        return preempts_within(self.config, self.tasks[k].queue, self.tasks[victim].queue)

    def pool_of(self, k: int) -> tuple[str, str]:
        """Running job ``k``'s queue and the GPU pool its GPUs are in."""
        return self.tasks[k].queue, self.config.pool_of(self.model[k])

    def use(self) -> dict[str, QueueUse]:
        """What each queue's running jobs hold now (``borrowed`` recomputed)."""
        return queue_use(rebalance(self.config, self.holdings()))

    def after_pass(self, now: float) -> None:
        """Reclaim for the jobs the pass left waiting, then pass once more (module docstring, step 3)."""
        if not self.reclaim or self.plan is None:
            return
        sim = self.sim
        plan = self.plan
        waiting = [self.tasks[k] for task_id in (*plan.order, *plan.refused)
                   if (k := self.by_id[task_id]) not in sim.placed]
        if not waiting:
            return
        holdings = self.holdings()
        by_node = {node.node_id: (self.node_model[i], int(node.capacity.gpus - math.ceil(sim.running_gpus[i] - 1e-9)))
                   for i, node in enumerate(sim.base.nodes) if node.capacity.gpus > 0}
        victims = reclaim_for(self.config, waiting, holdings, idle_by_node=by_node)
        if not victims:
            return
        for v in victims:
            self.preempt(self.by_id[v.task_id], now)
        self.reclaims += len(victims)
        self.claims = frozenset(v.for_queue for v in victims)   # the next pass places their jobs first
        sim.schedule(now, True)
