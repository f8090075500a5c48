"""Priorities and preemption in the simulator, with the leader's own victim-choice rule.

Trace QoS classes become priorities (:func:`priority_of`): openb's pods carry a Kubernetes-style QoS
class in the ``group`` column, mapped as

=====================  ========
openb class            priority
=====================  ========
``Guaranteed``, ``LS``  20 (high)
``Burstable``           10 (middle)
``BE``                  0 (low)
=====================  ========

Any other group (Philly's virtual clusters) has priority 0: Philly has no classes, so every job is
equal and nothing is ever preempted.

With ``SimConfig(preemption=True)``, after each scheduling pass :class:`SimPreemption` asks
:func:`coordinator.qos.preemption.choose_preemption` — the decision the leader's Preemptor makes, with the same
placement-engine fit check — for victims for the head of every pending shape (a shape's later jobs need the same
nodes): the first in queue order whose priority beats the lowest running job and that victims would let in. Only
jobs running since before this timestamp are candidates: on the leader, a task placed in the same cycle is not
running yet.
Victims stop at once in virtual time (the checkpoint signal and stop grace are not modelled): they lose all
progress since their last start
(no checkpoint is modelled, so the lost GPU-time is an upper bound) and go back to the queue with
their original request (submit time and priority), where they run their whole duration again later.
The preemptor is placed on the freed resources at once, by a pass over it alone, before any other pending job (the
leader holds lower-priority work back for it the same way): with team queues it is admitted by its queue, elastic it
is sized like any job. Another pass follows. A job preempted less than ``protection_s`` ago is never chosen again.

With team queues (:mod:`coordinator.simulator.queues`), as on the leader, a job preempts only within its own queue
(:func:`coordinator.queues.planning.preempts_within`; across queues only reclaim takes GPUs back), and only the jobs
the queues' plan admitted and placement refused are helped (a job its queue refused waits for its queue).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Sequence

from coordinator.qos.preemption import Candidate, Fits, NodeHolding, choose_preemption
from coordinator.simulator.ports import Replay

__all__ = ["QOS_CLASS_PRIORITY", "SimPreemption", "priority_of"]

QOS_CLASS_PRIORITY: dict[str, int] = {"guaranteed": 20, "ls": 20, "burstable": 10, "be": 0}
"""openb QoS class (lower case) → priority; any other group is 0."""


def priority_of(group: str) -> int:
    """The priority a trace job's group stands for.

    :param group: the ``group`` column (openb QoS class, Philly virtual cluster, or empty).
    :returns: 20, 10 or 0 (see the module docstring).
    """
    return QOS_CLASS_PRIORITY.get(group.strip().lower(), 0)


class SimPreemption:
    """Preemption inside one replay (owned by the :class:`~coordinator.simulator.engine.Simulator`).

    :param sim: the replay whose queue and reservations it changes.
    :param protection_s: a job is not preempted again within this many virtual seconds.
    :param fits: the placement engine's fit check (the replay's policy, threshold and mode).
    """

    def __init__(self, sim: Replay, protection_s: float, fits: Fits) -> None:
        self.sim = sim
        self.protection_s = protection_s
        self.fits = fits
        self.count: Counter[int] = Counter()         # job index → times preempted
        self.lost_run_s: defaultdict[int, float] = defaultdict(float)   # job index → run time lost to preemptions
        self.last_s: dict[int, float] = {}           # job index → when it was last preempted
        self.preemptions = 0
        # The jobs a pass left waiting that preemption may help (default: the head of every pending shape; with
        # team queues, what their plan admitted and placement refused, as on the leader).
        self.waiting: Callable[[], Sequence[int]] = sim.heads
        # Whether job k may take what job v holds (default: any; with team queues, only within its queue).
        self.allowed: Callable[[int, int], bool] | None = None

    def after_pass(self, now: float) -> None:
        """Preempt for refused high-priority jobs until none can be helped; a pass follows each preemption."""
        while self._one(now):
            self.sim.schedule(now, True)

    def _running(self, now: float) -> list[tuple[int, Candidate]]:
        sim = self.sim
        out = []
        for k, placement in sim.placed.items():
            start = sim.start_times.get(k)
            if start is None or start >= now:
                continue   # started by this timestamp's passes (on the leader: placed in this cycle, not yet running)
            req = sim.jobs[k].request
            holds = tuple(NodeHolding(a.node_id, a.gpu_indices, placement.demand, a.gpu_share)
                          for a in placement.assignments)
            out.append((k, Candidate(req.task_id, req.priority, start, self.last_s.get(k), True, holds)))
        return out

    def _one(self, now: float) -> bool:
        """One preemption, as the leader's cycle decides it (:func:`choose_preemption` over the head of every
        pending shape: a shape's later jobs need the same nodes); True when one happened."""
        sim = self.sim
        running = self._running(now)
        if not running:
            return False
        by_id = {c.id: k for k, c in running}
        allowed = self.allowed
        chosen = choose_preemption([sim.request(k) for k in self.waiting()], [c for _k, c in running],
                                   sim.engine.snapshot, self.fits, now=now, protection_s=self.protection_s,
                                   allowed=None if allowed is None else
                                   lambda req, c: allowed(sim.job_of(req.task_id), by_id[c.id]))
        if chosen is None:
            return False
        req, victims = chosen
        for v in victims:
            self.preempt(by_id[v.id], now)
        # The preemptor is placed at once on what its victims freed, by a pass of its own (the rest of the queue
        # waits for the next pass, as the leader holds lower-priority work back for it).
        sim.schedule(now, True, only=[sim.job_of(req.task_id)])
        return True

    def preempt(self, k: int, now: float) -> None:
        """Stop job ``k``: give its reservations back and queue it again with its original request
        (team-queue reclaim, :mod:`coordinator.simulator.queues`, preempts through this too)."""
        sim = self.sim
        self.lost_run_s[k] += now - sim.start_times[k]
        sim.stop(k, now)
        self.count[k] += 1
        self.last_s[k] = now
        self.preemptions += 1
        sim.requeue(k)

    def per_job(self) -> dict[str, tuple[int, float]]:
        """``job id → (times preempted, run seconds lost)`` for every job preempted at least once."""
        return {self.sim.jobs[k].request.task_id: (n, self.lost_run_s[k]) for k, n in self.count.items()}

