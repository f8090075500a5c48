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

With ``SimConfig(preemption=True)``, after each scheduling pass :class:`SimPreemption` looks at the
head of every refused shape whose priority beats the lowest running job, highest priority first,
and asks :func:`coordinator.qos.preemption.choose_candidates` (the rule the leader's Preemptor uses,
with the same placement-engine fit check) for victims. Victims stop at once in virtual time (the
checkpoint signal and stop grace are not modelled): they lose all progress since their last start
(no checkpoint is modelled, so the lost GPU-time is an upper bound) and go back to the queue with
their original request (submit time and priority), where they run their whole duration again later.
The preemptor is placed on the freed resources at once, before any other pending job (the leader
holds lower-priority work back for it the same way), and another pass follows. A job preempted
less than ``protection_s`` ago is never chosen again.
"""

from __future__ import annotations

import heapq
from collections import Counter, defaultdict
from typing import TYPE_CHECKING

from coordinator.domain import Placement, queue_key
from coordinator.qos.preemption import Candidate, Fits, NodeHolding, choose_candidates

if TYPE_CHECKING:
    from coordinator.simulator.engine import Simulator

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

    :param sim: the simulator whose queue and reservations it changes.
    :param protection_s: a job is not preempted again within this many virtual seconds.
    """

    def __init__(self, sim: Simulator, protection_s: float) -> None:
        self.sim = sim
        self.protection_s = protection_s
        self.fits = Fits(sim.config.policy, sim.config.threshold, sim.config.threshold_mode)
        self.count: Counter[int] = Counter()         # job index → times preempted
        self.lost_run_s: defaultdict[int, float] = defaultdict(float)   # job index → run time lost to preemptions
        self.last_s: dict[int, float] = {}           # job index → when it was last preempted
        self.stale: Counter[int] = Counter()         # job index → completions to ignore (runs cut short)
        self.preemptions = 0

    def stale_completion(self, k: int) -> bool:
        """Whether a completion event of job ``k`` belongs to a run that was preempted (then it is ignored)."""
        if self.stale[k]:
            self.stale[k] -= 1
            return True
        return False

    def after_pass(self, now: float) -> None:
        """Preempt for refused high-priority jobs until none can be helped; a pass follows each preemption."""
        while self._one(now):
            self.sim._schedule(now, True)

    def _running(self, now: float) -> list[tuple[int, Candidate]]:
        sim = self.sim
        out = []
        for k, placement in sim.placed.items():
            start = sim.start_times.get(k)
            if start is None or start > now:
                continue   # still waking its nodes: not running yet
            req = sim.jobs[k].request
            holds = tuple(NodeHolding(a.node_id, a.gpu_indices, placement.demand, a.gpu_share)
                          for a in placement.assignments)
            out.append((k, Candidate(req.task_id, req.priority, start, self.last_s.get(k), True, holds)))
        return out

    def _one(self, now: float) -> bool:
        sim = self.sim
        running = self._running(now)
        if not running:
            return False
        lowest = min(c.priority for _k, c in running)
        heads = sorted((bucket[0] for bucket in sim.buckets.values() if bucket), key=lambda item: item[0])
        heads = [(key, k) for key, k in heads if sim.jobs[k].request.priority > lowest]
        if not heads:
            return False
        snapshot = sim.engine.snapshot()
        by_id = {c.id: k for k, c in running}
        for _key, k in heads:
            req = sim.jobs[k].request
            victims = choose_candidates(req, snapshot, (c for _j, c in running), self.fits, now=now,
                                        protection_s=self.protection_s)
            if not victims:
                continue
            for v in victims:
                self.preempt(by_id[v.id], now)
            self._place(k, now)
            return True
        return False

    def preempt(self, k: int, now: float) -> None:
        """Stop job ``k``: give its reservations back and queue it again with its original request
        (team-queue reclaim, :mod:`coordinator.simulator.queues`, preempts through this too)."""
        sim = self.sim
        sim._release(k, now, preempted=True)
        self.lost_run_s[k] += now - sim.start_times.pop(k)
        self.count[k] += 1
        self.last_s[k] = now
        self.stale[k] += 1
        self.preemptions += 1
        sim.refused.clear()
        sim._arrive(k)

    def _place(self, k: int, now: float) -> None:
        """Place the preemptor at once on what its victims freed (the rest of the queue waits for the next pass)."""
        sim = self.sim
        req = sim.jobs[k].request
        decision = sim.engine.place(req)
        if not isinstance(decision, Placement):
            return   # cannot happen while the fit check and the engine agree; the next pass retries it
        bucket = sim.buckets[sim.shapes[k]]
        bucket.remove((queue_key(req), k))
        heapq.heapify(bucket)
        sim._placed(k, decision, now)

    def per_job(self) -> dict[str, tuple[int, float]]:
        """``job id → (times preempted, run seconds lost)`` for every job preempted at least once."""
        return {self.sim.jobs[k].request.task_id: (n, self.lost_run_s[k]) for k, n in self.count.items()}

