"""Elastic jobs in the replay, resized by the leader's own pipeline and rules (:mod:`coordinator.elastic.rules`).

With ``SimConfig(elastic=ElasticSimConfig(...))`` every job of a replay that asks for whole GPUs and
has a model (:func:`elastic_config`) is elastic: it may run at any size of
``ElasticRange(min_gpus, min(max_gpus, max_factor × its trace GPUs), node_gpus)`` (node width: the
cluster's widest node). Its **work** is its trace duration × its model's true throughput at its trace
GPU count (:mod:`coordinator.simulator.scaling`), and at a size ``n`` it progresses at the true
throughput at ``n``: it ends when its work is done, so a job that grows finishes sooner.

Every scheduling pass of the :class:`~coordinator.simulator.engine.Simulator` goes through
:meth:`SimElastic.schedule`, which runs the scheduling pipeline the leader's cycle runs
(:mod:`coordinator.scheduler.pipeline`), in the same order, through the replay's narrow interface
(:class:`~coordinator.simulator.ports.Replay`):

1. :func:`~coordinator.scheduler.pipeline.plan_placements` over the pending jobs (with team queues, their state from
   :class:`~coordinator.simulator.queues.SimQueues`: admission, fair order, what an elastic job may take beyond its
   minimum): elastic jobs at their first size (their minimum; a resized job's target), placed smaller when refused,
   and, when no whole-GPU job was left waiting, sized into the idle GPUs left over, each up to its target size after
   a resize, else its maximum; the placed jobs start;
2. :func:`~coordinator.scheduler.pipeline.plan_resizes` decides the resizes: with jobs left waiting, running
   elastic jobs shrink for them (with team queues, also for a job its queue refused); else they grow into the idle
   GPUs of ready nodes (the engine's node snapshots, which carry the adaptor's ready flags: a grow never wakes a
   node), on their own node or, when it has no room, on another one their request accepts (with team queues,
   within their queue's room).

A **resize** is a checkpoint-restart, as on the leader: the job's run ends (its placement released, its
progress kept), it goes back into the pending queue (at its place in the queue: its submission time)
with its target size, and the next pass — run at once — places it at its first size and sizes it towards
the target as in step 1. It holds its GPUs for ``restart_cost_s`` before progressing again. Its old
completion event is ignored when it comes (stale-completion bookkeeping as in
:mod:`coordinator.simulator.qos`, by the current run's end time: a grown run ends before the run it replaced
would have), and a new one is scheduled at every start. A job resizes at most once
per ``interval_s`` (the rules' hysteresis); a pass runs when a job's hysteresis runs out, so a job that
may grow again does not wait for the next arrival or completion.

The allocator **knows what the leader knows** (:mod:`coordinator.elastic.allocator`), never the replay's truth:

- **throughput** is learned as the leader learns it: a :class:`~coordinator.elastic.rules.SpeedupCurve` per
  job, fed one reading per leader cycle (:data:`LEADER_CYCLE_S`) once a run is past its restart and
  :data:`coordinator.elastic.allocator.WARMUP_S` — the job's true throughput at its size times ``exp(σ·z)``,
  ``z`` a seeded standard normal draw, ``σ`` ``throughput_noise`` (default: its model's measured spread,
  :attr:`~coordinator.simulator.scaling.ScalingCurve.noise`). Passes are events, not cycles: a pass folds the
  readings of the cycles since the last one it folded, at most :data:`READINGS_PER_PASS` (the curve's moving
  average weighs older ones at under 6 % after that many). It never sees the curve at sizes the job has not run at.
- **remaining run time** is the profiler's estimate, as on the leader
  (:func:`coordinator.elastic.allocator.remaining_estimate_s`): a :class:`~coordinator.profiler.Profiler` fed the run
  time (last start to end) of every job that finished, per model name, less what the current run ran; unknown
  (None) until a job of that model finished.
- **restart cost** is measured as the leader measures it (:func:`coordinator.elastic.allocator.learned_restart_cost_s`):
  from a resize's stop until the job runs again (a run "runs" once its restart is paid: the replay charges the
  whole checkpoint-restart at the start of the next run), a moving average folded in at each resize; the
  leader's default (``assumed_restart_cost_s``, :data:`coordinator.elastic.rules.DEFAULT_RESTART_COST_S`) until
  one was measured.

``oracle=True`` (``gptrmctl simulate --elastic --oracle``) gives it the truth instead, for comparison: the
true throughput at each size a job ran at (once per run), the exact remaining run time from the work left, and
the true restart cost.

Disabling grows or shrinks (``grow=False``, ``shrink=False``) attributes the gain of elasticity: the
cycle's structure stays (a pass with jobs left waiting never grows), only that kind of resize is not
planned.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from common.pb.gptrm.v1 import types_pb2
from coordinator.domain import NodeSnapshot, Placement, Request
from coordinator.elastic.allocator import WARMUP_S, learned_restart_cost_s, remaining_estimate_s
from coordinator.elastic.rules import (
    DEFAULT_RESTART_COST_S,
    ElasticJob,
    ElasticRange,
    ElasticSettings,
    Resize,
    SpeedupCurve,
    first_size,
    placement_gpus,
    request_at,
)
from coordinator.profiler import Profiler
from coordinator.scheduler.pipeline import (
    PendingTask,
    PlacementInputs,
    RefusedTask,
    ResizeInputs,
    on_pool,
    plan_placements,
    plan_resizes,
)
from coordinator.simulator.ports import Replay, SimJob
from coordinator.simulator.scaling import MAX_GPUS, ScalingCurve, assign_models

if TYPE_CHECKING:
    from coordinator.simulator.queues import SimQueues

REPLAY_INTERVAL_S = 300.0
"""The replay's resize interval by default (``--elastic-interval``): its jobs run for hours, so a resize every
five minutes at most (the leader's default is shorter, :data:`coordinator.elastic.rules.DEFAULT_INTERVAL_S`)."""
LEADER_CYCLE_S = 1.0
"""The leader observes its elastic tasks' throughput once per scheduling cycle, at least once a second."""
READINGS_PER_PASS = 8
"""Readings a pass folds into a job's curve at most (one per leader cycle since the last it folded)."""

__all__ = ["ElasticSimConfig", "SimElastic", "elastic_config", "gpu_hours"]


@dataclass(frozen=True, slots=True)
class ElasticSimConfig:
    """Which jobs are elastic and how they resize.

    :param curves: model name → its true throughput curve.
    :param models: the model of each replayed job, by index ("" or missing: a rigid job).
    :param max_factor: a job's maximum is this × its trace GPUs (capped at ``max_gpus``).
    :param min_gpus: every elastic job's minimum.
    :param max_gpus: the largest maximum.
    :param node_gpus: node width of the ranges (None: the cluster's widest node).
    :param interval_s: the rules' hysteresis (:class:`~coordinator.elastic.rules.ElasticSettings`).
    :param restart_cost_s: what a resize costs a job (GPUs held, no progress); what the rules are told with the
        oracle.
    :param assumed_restart_cost_s: what the rules assume until a job's restarts were measured (the leader's
        ``--elastic-restart-cost``).
    :param grow: plan grows (False: shrink only).
    :param shrink: plan shrinks (False: grow only).
    :param oracle: the allocator is told the truth (throughput, remaining run time, restart cost) instead of
        what the leader would know (module docstring).
    :param throughput_noise: relative standard deviation of a throughput reading (None: the job's model's
        measured spread).
    :param seed: the readings' noise draws.
    """

    curves: Mapping[str, ScalingCurve]
    models: Sequence[str]
    max_factor: float = 4.0
    min_gpus: int = 1
    max_gpus: int = MAX_GPUS
    node_gpus: int | None = None
    interval_s: float = REPLAY_INTERVAL_S
    restart_cost_s: float = DEFAULT_RESTART_COST_S
    assumed_restart_cost_s: float = DEFAULT_RESTART_COST_S
    grow: bool = True
    shrink: bool = True
    oracle: bool = False
    throughput_noise: float | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.max_factor < 1 or not math.isfinite(self.max_factor):
            raise ValueError(f"elastic max factor must be ≥ 1, got {self.max_factor}")
        if self.min_gpus < 1 or self.max_gpus < self.min_gpus:
            raise ValueError(f"elastic sizes {self.min_gpus}..{self.max_gpus} are empty")
        noise = self.throughput_noise
        if noise is not None and (noise < 0 or not math.isfinite(noise)):
            raise ValueError(f"throughput noise must be ≥ 0, got {noise}")
        ElasticSettings(self.interval_s, self.restart_cost_s)   # validates both
        ElasticSettings(self.interval_s, self.assumed_restart_cost_s)


def gpu_hours(job: SimJob) -> float:
    """A trace job's GPU-hours: its duration × its whole GPUs over all its nodes."""
    return job.duration_s * job.request.whole_gpus / 3600.0


def elastic_config(jobs: Sequence[SimJob], curves: Mapping[str, ScalingCurve], *, seed: int = 0,
                   **kwargs: Any) -> ElasticSimConfig:
    """Every job that asks for whole GPUs is elastic, with the model its GPU-hours draw
    (:func:`coordinator.simulator.scaling.assign_models`; ``seed`` also seeds the throughput readings' noise); the
    other keyword arguments go to :class:`ElasticSimConfig`."""
    models = assign_models([gpu_hours(j) for j in jobs], seed)
    return ElasticSimConfig(curves=curves, models=tuple(m if j.request.whole_gpus >= 1 else ""
                                                        for m, j in zip(models, jobs, strict=True)), seed=seed,
                            **kwargs)


@dataclass(slots=True)
class _Job:
    """An elastic job's state in the replay."""

    range: ElasticRange
    true: ScalingCurve
    work: float                      # samples left to train
    spec: types_pb2.TaskSpec         # what the profiler learns run times by (its model's name)
    curve: SpeedupCurve = field(default_factory=SpeedupCurve)
    target: int | None = None        # size the last resize aimed at
    last_resize_s: float | None = None
    owed_s: float = 0.0              # restart still to pay at the start of the next run
    size: int = 0                    # GPUs of the current run
    observed: bool = False           # the current run's throughput was folded into the curve (oracle)
    read_s: float | None = None      # the last leader cycle whose reading was folded in (this run)
    cost_s: float = 0.0              # restart cost as stored at the last resize (0: none measured)
    stop_s: float = 0.0              # when the last resize stopped it (0: never)
    first_start_s: float | None = None
    energy_j: float = 0.0            # energy of the runs that ended in a resize
    grows: int = 0
    shrinks: int = 0
    sizes: list[tuple[float, int]] = field(default_factory=list)   # (start, GPUs) of every run


class SimElastic:
    """Elastic jobs inside one replay (owned by the simulator; module docstring).

    :param sim: the replay whose passes it runs; it places an elastic job with :meth:`first_request`.
    :param config: which jobs are elastic and how they resize.
    """

    def __init__(self, sim: Replay, config: ElasticSimConfig) -> None:
        self.sim = sim
        self.config = config
        self.settings = ElasticSettings(config.interval_s,
                                        config.restart_cost_s if config.oracle else config.assumed_restart_cost_s)
        self.profiler = Profiler()
        self.rng = random.Random(config.seed)
        specs: dict[str, types_pb2.TaskSpec] = {}
        width = config.node_gpus or max((len(n.gpus) for n in sim.base.nodes), default=1) or 1
        self.jobs: dict[int, _Job] = {}
        self.by_id: dict[str, int] = {}
        for k, job in enumerate(sim.jobs):
            model = config.models[k] if k < len(config.models) else ""
            req = job.request
            gpus = req.whole_gpus
            if not model or gpus < 1 or req.demand.gpus < 1:
                continue
            top = max(config.min_gpus, min(config.max_gpus, int(config.max_factor * gpus)))
            rng = ElasticRange(config.min_gpus, top, width)
            true = config.curves[model]
            spec = specs.setdefault(model, types_pb2.TaskSpec(model=types_pb2.ModelSpec(name=model)))
            self.jobs[k] = _Job(rng, true, job.duration_s * true.at(gpus), spec)
            self.by_id[req.task_id] = k
        self.running: set[int] = set()
        self.end_s: dict[int, float] = {}      # running elastic job → when its current run ends
        self.passes = 0
        self._snapshots: dict[int, tuple[Any, tuple[Any, ...], NodeSnapshot]] = {}
        self.queues: SimQueues | None = None   # the replay's team queues (set by the replay when it has them)

    # ---- hooks the simulator calls -------------------------------------------------------------------

    def first_request(self, k: int) -> Request | None:
        """The request job ``k`` is first placed with: an elastic job's at its first size (None: a rigid job)."""
        job = self.jobs.get(k)
        return None if job is None else request_at(self.sim.jobs[k].request, job.range, first_size(job.range, 0))

    def stopped(self, k: int, placement: Placement, ran_s: float) -> bool:
        """Running job ``k`` was preempted after ``ran_s`` on ``placement`` (not resized): it loses the run's
        progress, as a preempted rigid job does, and its run's end is no longer awaited. True for an elastic job
        (then the replay stops counting its completion event: a run of it ends only at its current end time)."""
        job = self.jobs.get(k)
        if job is None:
            return False
        job.energy_j += self.sim.run_energy_j(placement, ran_s)
        self.running.discard(k)
        self.end_s.pop(k, None)
        return True

    def stale_completion(self, k: int, now: float) -> bool:
        """Whether a completion event of job ``k`` at ``now`` belongs to a run that was resized or preempted (then
        it is ignored): the job is not running, or its current run ends at another time. (Runs of one job end out
        of order — a grown run ends before the run it replaced would have — so a count of stale events would not
        tell them apart.)"""
        if k not in self.jobs:
            return False
        return k not in self.running or self.end_s.get(k) != now

    def finished(self, k: int, start_s: float, energy_j: float) -> tuple[float, float]:
        """Job ``k`` completed; ``(first start, energy of all its runs)`` for its record."""
        job = self.jobs.get(k)
        if job is None:
            return start_s, energy_j
        self.running.discard(k)
        end = self.end_s.pop(k, None)
        if end is not None:   # the leader's profiler learns its run time, last start to end
            self.profiler.observe_run(job.spec, end - self._running_since(k, start_s))
        job.work = 0.0
        return (job.first_start_s if job.first_start_s is not None else start_s), job.energy_j + energy_j

    def schedule(self, now: float, only: Sequence[int] | None = None) -> None:
        """Passes at ``now`` until no resize follows one (module docstring, steps 1-2); ``only``: one pass over
        these pending jobs alone (a preemptor), without resizes."""
        sim = self.sim
        queues = self.queues
        while True:
            self.passes += 1
            pending = sim.pending() if only is None else only
            tasks = []
            for k in pending:
                job = self.jobs.get(k)
                queued = queues.queued(k) if queues is not None else None
                if job is None:
                    tasks.append(PendingTask(sim.request(k), queued))
                else:
                    tasks.append(PendingTask(sim.request(k), queued, job.range, job.target or 0, job.curve))
            plan = plan_placements(PlacementInputs(
                now, tasks, engine_for=lambda _: sim.engine, place=sim.place,
                queues=queues.state(now) if queues is not None else None,
                claims=queues.claimed() if queues is not None else frozenset()))
            if queues is not None:
                queues.plan = plan.queues
            for d in plan.decisions:
                if not isinstance(d, Placement):
                    continue
                k = sim.job_of(d.task_id)
                sim.book(k, d, now)
                if queues is not None:
                    queues.booked(k, d, plan.beyond.get(d.task_id, 0))
                if k in self.jobs:
                    self._begin(k, d, now)
                else:
                    sim.start(k, d, now, sim.jobs[k].duration_s)
            if only is not None or not self._step(now, plan.waiting()):
                return

    # ---- the cycle's steps, by the pipeline's rules ----------------------------------------------------------

    def _nodes(self) -> list[NodeSnapshot]:
        """Every node as the engine sees it now (ready flags and reservations); a node's snapshot is rebuilt
        only when its reservations changed or the engine was rebuilt."""
        state = self.sim.engine.state
        out = []
        for i in range(len(state.nodes)):
            key = (tuple(state.slot_share[i]), tuple(state.slot_mem[i]), state.used_of(i))
            cached = self._snapshots.get(i)
            if cached is None or cached[0] is not state or cached[1] != key:
                cached = (state, key, state.node_snapshot(i))
                self._snapshots[i] = cached
            out.append(cached[2])
        return out

    def _begin(self, k: int, placement: Placement, now: float) -> None:
        """Job ``k`` starts a run on ``placement``: its restart, then its work at its true throughput."""
        job = self.jobs[k]
        job.size = placement_gpus(placement)
        job.observed = False
        job.read_s = None
        if job.first_start_s is None:
            job.first_start_s = now
        job.sizes.append((now, job.size))
        self.running.add(k)
        run_s = job.owed_s + job.work / job.true.at(job.size)
        self.end_s[k] = now + run_s   # the completion event's time, computed the same way
        self.sim.start(k, placement, now, run_s)

    def _running_since(self, k: int, start_s: float | None = None) -> float:
        """When job ``k``'s current run runs, as the leader sees it: once its restart is paid."""
        return (self.sim.start_times[k] if start_s is None else start_s) + self.jobs[k].owed_s

    def _observe(self, now: float) -> None:
        """Fold each running job's throughput readings at its size into its learned curve (past its restart and
        warm-up): one noisy reading per leader cycle since the last one folded (module docstring); with the
        oracle, its true throughput once per run."""
        for k in sorted(self.running):
            job = self.jobs[k]
            first = self._running_since(k) + WARMUP_S
            if now < first:
                continue
            if self.config.oracle:
                if not job.observed:
                    job.curve = job.curve.observe(job.size, job.true.at(job.size))
                    job.observed = True
                continue
            last = job.read_s if job.read_s is not None else first - LEADER_CYCLE_S
            cycles = math.floor((now - last) / LEADER_CYCLE_S)
            if cycles <= 0:
                continue
            job.read_s = last + cycles * LEADER_CYCLE_S
            sigma = job.true.noise if self.config.throughput_noise is None else self.config.throughput_noise
            true = job.true.at(job.size)
            gauss = self.rng.gauss
            job.curve = job.curve.observe_all(job.size, [true * math.exp(sigma * gauss(0.0, 1.0)) if sigma else true
                                                         for _ in range(min(cycles, READINGS_PER_PASS))])

    def _step(self, now: float, left: Sequence[Request]) -> bool:
        """Shrink for the jobs the pass left waiting (``left``, in queue order) or, with team queues, for a job its
        queue refused, or grow into idle GPUs when none waits, as the pipeline's
        :func:`~coordinator.scheduler.pipeline.plan_resizes` decides; True when a job resized."""
        if not self.running:
            return False
        sim = self.sim
        queues = self.queues
        self._observe(now)
        waiting = bool(left)
        refused = queues.refused() if queues is not None else {}
        if not refused and ((waiting and not self.config.shrink) or (not waiting and not self.config.grow)):
            return False
        interval = self.settings.interval_s
        start_times = sim.start_times
        # Only jobs the hysteresis lets resize (the rules leave the others out first thing: cheaper here), and only
        # jobs that were running before this timestamp: on the leader a task placed by a cycle is not running yet
        # when that cycle resizes, so a job is never resized in the pass that started it.
        jobs = [self._as_job(k, now) for k in sorted(self.running)
                if start_times[k] < now and ((last := self.jobs[k].last_resize_s) is None or now - last >= interval)]
        if not jobs or ((waiting or not self.config.grow) and not any(j.size > j.range.minimum for j in jobs)):
            return False   # nothing to resize (cheaper than asking the rules)
        requests = {j.task_id: sim.jobs[self.by_id[j.task_id]].request for j in jobs}
        keys: dict[str, tuple[str, str]] = {}
        view = None
        if queues is not None:   # each job's queue and pool, held to its pool, and the queues' use (as the leader)
            keys = {j.task_id: queues.pool_of(self.by_id[j.task_id]) for j in jobs}
            requests = {t: on_pool(r, keys[t][1]) for t, r in requests.items()}
            view = (queues.config, queues.use(), queues.capacity)
        plan = plan_resizes(ResizeInputs(
            now=now, settings=self.settings, jobs=jobs, nodes=self._nodes(), waiting=left, requests=requests,
            refused=[RefusedTask(queues.queued(k), sim.jobs[k].request.priority, why) for k, why in refused.items()]
            if queues is not None else (), queue_pools=keys, queues=view, explain=False))
        gave: dict[str, int] = {}
        for d in plan.resizes:
            self._resize(self.by_id[d.task_id], d, now)
            if d.for_task:
                gave[d.for_task] = gave.get(d.for_task, 0) + d.from_gpus - d.to_gpus
        if sim.adaptor is not None:   # as the cycle tells the leader's power manager
            for task_id, gpus in sorted(gave.items()):
                sim.adaptor.shrunk_for(task_id, gpus)
        return bool(plan.resizes)

    def _work_left(self, k: int, now: float) -> float:
        """Work running job ``k`` has left at ``now``: it progresses at its true throughput once its restart is paid."""
        job = self.jobs[k]
        ran = now - self.sim.start_times[k]
        return max(0.0, job.work - max(0.0, ran - job.owed_s) * job.true.at(job.size))

    def _as_job(self, k: int, now: float) -> ElasticJob:
        """Job ``k`` as the rules see it: what the leader would know of it (module docstring), or the truth with
        the oracle."""
        job = self.jobs[k]
        req = self.sim.jobs[k].request
        placement = self.sim.placed[k]
        if self.config.oracle:
            elapsed = now - self.sim.start_times[k]
            rate = job.true.at(job.size)
            remaining = self._work_left(k, now) / rate + max(0.0, job.owed_s - elapsed) if rate > 0 else None
            restart_s = self.config.restart_cost_s
        else:
            since = self._running_since(k)
            remaining = remaining_estimate_s(self.profiler.expected_run_s(job.spec), max(0.0, now - since))
            restart_s = self._restart_cost_s(k, now)
        return ElasticJob(req.task_id, req.priority, job.range, job.size,
                          tuple((a.node_id, len(a.gpu_indices)) for a in placement.assignments), job.curve,
                          restart_s, job.last_resize_s, remaining or None)

    def _restart_cost_s(self, k: int, now: float) -> float:
        """Job ``k``'s restart cost as the leader measures it (the stored average, the restart just paid folded in)."""
        job = self.jobs[k]
        since = self._running_since(k) if k in self.running else None
        return learned_restart_cost_s(job.cost_s, job.stop_s, since if since is not None and since <= now else None,
                                      self.settings.restart_cost_s)

    def _resize(self, k: int, decision: Resize, now: float) -> None:
        """Carry out a resize: the run ends (progress kept), the job goes back to the queue at its target."""
        sim = self.sim
        job = self.jobs[k]
        if job.stop_s:   # the leader stores the measured restart cost with each resize
            job.cost_s = self._restart_cost_s(k, now)
        job.stop_s = now
        job.work = self._work_left(k, now)
        ran = now - sim.start_times[k]
        placement = sim.stop(k, now, resized=True)
        job.energy_j += sim.run_energy_j(placement, ran)
        job.owed_s = self.config.restart_cost_s
        job.target = decision.to_gpus
        job.last_resize_s = now
        if decision.grow:
            job.grows += 1
        else:
            job.shrinks += 1
        self.running.discard(k)
        self.end_s.pop(k, None)
        # Back in the queue at its first size: the resize's target (the cycle's request for a requeued task).
        sim.requeue(k, request_at(sim.jobs[k].request, job.range, first_size(job.range, job.target)))
        due = now + self.settings.interval_s
        while due - now < self.settings.interval_s:
            due = math.nextafter(due, math.inf)
        sim.tick_at(due)   # its hysteresis runs out then: it may resize again

    # ---- results -------------------------------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        """``elastic_jobs``, ``resizes_grow``, ``resizes_shrink`` and per elastic job ``grows_per_job``,
        ``shrinks_per_job``."""
        n = len(self.jobs)
        grows = sum(j.grows for j in self.jobs.values())
        shrinks = sum(j.shrinks for j in self.jobs.values())
        return {"elastic_jobs": n, "resizes_grow": grows, "resizes_shrink": shrinks,
                "grows_per_job": grows / n if n else 0.0, "shrinks_per_job": shrinks / n if n else 0.0,
                "elastic_passes": self.passes}

    def sizes(self, k: int) -> list[tuple[float, int]]:
        """``(start, GPUs)`` of every run of job ``k`` (empty for a rigid job)."""
        job = self.jobs.get(k)
        return list(job.sizes) if job is not None else []
