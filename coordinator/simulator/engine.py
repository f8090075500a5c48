"""The discrete-event loop: replay jobs against a simulated cluster in virtual time.

Decisions come from the coordinator's own scheduling pipeline (:mod:`coordinator.scheduler.pipeline`, the pure
functions the leader's cycle runs): the pending queue is ordered by :func:`coordinator.domain.queue_key` (priority, then
slack against the expected run time, then submit time: the leader's order), and every placement is made by the
production :class:`coordinator.scheduler.placement.engine.PlacementEngine` (policy filter and rank, then the
Resource Allocator's GPU choice). The engine lives for the whole replay: placements reserve in it and
finished jobs :meth:`~coordinator.scheduler.placement.engine.PlacementEngine.release` their reservations, so no
snapshot is rebuilt per event (only when the elastic pool below changes).

The simulator's parts (elastic jobs, team queues, preemption) see the replay through one narrow interface,
:class:`coordinator.simulator.ports.Replay` (book, start, stop, requeue; the pending queue in order), which the
:class:`Simulator` implements; they never import this module.

One pass on given inputs, for comparing the simulator's decisions with the leader's: build a :class:`Simulator`
whose jobs are all submitted at one time and call :meth:`Simulator.step`; it runs that timestamp (arrivals, one
pass with its sizing, resizes, preemption and reclaim) and returns a :class:`PassRecord` — the runs it started
(task id → placement), the runs it stopped (preempted or resized) and the tasks left waiting. Later calls
process the next timestamps the same way.

Events live in one ``heapq``. Everything that happens at one virtual time — completions,
delayed starts, arrivals — is applied first, then **one** scheduling pass runs, then idle nodes
whose power-down timer expired are powered down (after the pass, so a node that just received
work stays up).

A pass decides what ``place_batch(queue)`` would — the placement step of
:func:`~coordinator.scheduler.pipeline.plan_placements` — cheaply. Between releases reservations only
grow, so a request refused once stays refused until something is released: the pass groups the
queue by *shape* (identical demand and constraints), tries each shape's head in the order
``place_batch`` uses (descending compute demand for Alg. 1-3 — a stable sort over queue order —
queue order for the baselines), and stops trying a shape at its first refusal. A pass after
pure arrivals therefore tries only the new shapes. Refusals consume no randomness and move no
round-robin cursor, so the decisions equal those of ``place_batch`` over the whole queue;
``SimConfig(exact_batches=True)`` runs :func:`~coordinator.scheduler.pipeline.plan_placements` itself over the whole
queue on every pass, and the tests compare both.

Priorities and preemption (``SimConfig(preemption=True)``): after each pass the QoS Manager's
victim choice runs on the refused high-priority jobs; see :mod:`coordinator.simulator.qos`. A preempted run's
completion event is ignored when it comes (the replay counts them, :attr:`Simulator.stale`; an elastic job's by the
end time of its current run).

Team queues (``SimConfig(queues=...)``): each job runs in the queue its trace ``group`` names
(:attr:`SimJob.queue`), and every pass is the pipeline's
:func:`~coordinator.scheduler.pipeline.plan_placements` with the queues' state (admission and fair order by
:func:`coordinator.queues.planning.plan_queues`) and, with ``reclaim``,
:func:`~coordinator.queues.planning.reclaim_for` afterwards; see
:mod:`coordinator.simulator.queues`. The shape buckets stay (they hold the pending jobs in queue
order), but a pass places the plan's order, not the buckets' heads.

Every run of a job (from a start to its end or preemption) is kept in :attr:`SimResult.runs`, so
per-job records can be written and per-queue figures recomputed from them.

Elastic jobs (``SimConfig(elastic=...)``): jobs resize between their minimum and maximum by the
pipeline's rules; every pass goes through :class:`coordinator.simulator.elastic.SimElastic`: the pipeline's
:func:`~coordinator.scheduler.pipeline.plan_placements` itself (placement at the first size, placed smaller when
refused and sized before the start; with team queues, their admission and room), then the resizes
:func:`~coordinator.scheduler.pipeline.plan_resizes` decides; an elastic job's run time follows from its work and its
true throughput at the size it holds; see :mod:`coordinator.simulator.elastic`. Elastic jobs, team queues and
preemption combine as on the leader: a pass that resized is followed by another before any preemption (the
leader preempts only in a cycle that resized nothing), priority preemption stays within a queue and helps only what
the queues admitted, and a preemptor is placed by a pass of its own (:meth:`Simulator.schedule` with ``only``), so
it is admitted by its queue and, elastic, sized like any job.

Node power is the production Resource Adaptor's: with ``power_down_after_s`` the replay drives
:class:`coordinator.adaptor.power.PowerManager` with the ``simulated`` node provider in virtual
time (:mod:`coordinator.simulator.adaptor_driver`). It powers down nodes idle longer than
``power_down_after_s`` beyond ``spare_nodes``, and wakes the off node that adds the least idle power
for a job the pass could not place; a woken node takes work ``wake_delay_s`` (its boot time) later.
Only nodes whose power state is ready are schedulable. The manager steps after every timestamp's
pass (and before it, so booted nodes are back in service), and at the next time it would act on
its own (a power-down deadline, a boot completing).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from coordinator.domain import ClusterSnapshot, Decision, Placement, Rejection, Request, queue_key
from coordinator.scheduler.pipeline import PendingTask, PlacementInputs, plan_placements
from coordinator.scheduler.placement.engine import PlacementEngine
from coordinator.scheduler.policies import build as build_policy
from coordinator.scheduler.policies import time_aware
from coordinator.scheduler.policies.base import DEFAULT_THRESHOLD, DEFAULT_THRESHOLD_MODE, Policy
from coordinator.simulator.adaptor_driver import SimAdaptor
from coordinator.simulator.metrics import JobRecord, MetricsRecorder, Series, summarize_jobs
from coordinator.simulator.ports import SimJob

if TYPE_CHECKING:
    from coordinator.queues import QueueConfig
    from coordinator.simulator.elastic import ElasticSimConfig, SimElastic
    from coordinator.simulator.qos import SimPreemption
    from coordinator.simulator.queues import SimQueues

__all__ = ["JobRun", "PassRecord", "SimConfig", "SimJob", "SimResult", "Simulator"]

# event kinds; at one timestamp they are applied in this order (a tick: an elastic job's hysteresis ran out)
_COMPLETE, _ARRIVE, _POWER, _TICK = 0, 1, 2, 3

Shape = tuple[Any, ...]
""":attr:`coordinator.domain.Request.shape`: two requests of one shape are accepted by the same nodes."""
QueueKey = tuple[int, float, float, str]
""":func:`coordinator.domain.queue_key` of a request."""


@dataclass(frozen=True, slots=True)
class JobRun:
    """One run of a job: from a start until it ended or was preempted.

    :param job: the job's index in the replayed jobs.
    :param start_s: when it started.
    :param end_s: when it ended or was preempted.
    :param placement: where it ran.
    :param preempted: whether the run was cut short.
    :param resized: whether it was cut short for a resize (an elastic job; then also ``preempted``).
    """

    job: int
    start_s: float
    end_s: float
    placement: Placement
    preempted: bool
    resized: bool = False


@dataclass(slots=True)
class PassRecord:
    """What one timestamp of a replay decided (:meth:`Simulator.step`).

    :param now: the timestamp.
    :param started: task id → the placement of every run started (a job started, restarted after a preemption or
        resized, placed by the pass, a preemption or a reclaim).
    :param stopped: task id → ``"preempted"`` (priority preemption or a queue's reclaim) or ``"resized"`` (an elastic
        job's checkpoint-restart at another size; its new run is in ``started`` when it was placed again at once).
    :param waiting: the task ids still pending afterwards, in queue order.
    """

    now: float
    started: dict[str, Placement] = field(default_factory=dict)
    stopped: dict[str, str] = field(default_factory=dict)
    waiting: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class SimConfig:
    """How to replay.

    :param policy: policy name from :data:`coordinator.scheduler.policies.POLICIES`.
    :param threshold: cap on the capped dimensions' utilization after placement, in (0, 1]; the
        coordinator's default.
    :param threshold_mode: which dimensions it caps (``whole-gpus``, the coordinator's default, lets a
        trace job take every GPU of a server; ``paper`` caps every dimension).
    :param seed: seed for the ``random`` policy.
    :param power_down_after_s: the adaptor powers a node down after this long without work (None: every
        node stays on).
    :param wake_delay_s: boot time: from powering a node on until it takes work.
    :param spare_nodes: idle nodes the adaptor keeps on (``--spare-nodes``).
    :param keep_order: decide in queue order also for the policies that sort by demand (FIFO).
    :param exact_batches: reference mode: hand the whole queue to ``place_batch`` on every pass (not with
        ``elastic``, whose passes are the pipeline's own).
    :param measure_until_s: stop the time-weighted metrics here (None: at the last event); job
        statistics always cover every job.
    :param keep_series: record samples per timestamp for plots.
    :param preemption: let higher-priority jobs preempt lower-priority ones (:mod:`coordinator.simulator.qos`).
    :param protection_s: a job is not preempted again within this many seconds.
    :param queues: team queues to replay (None: no queues, every pending job may be placed).
    :param reclaim: with ``queues``, let queues owed their quota preempt borrowers.
    :param elastic: resize elastic jobs (:mod:`coordinator.simulator.elastic`; None: every job is rigid).
    """

    policy: str
    threshold: float = DEFAULT_THRESHOLD
    threshold_mode: str = DEFAULT_THRESHOLD_MODE
    seed: int = 0
    power_down_after_s: float | None = None
    wake_delay_s: float = 0.0
    spare_nodes: int = 1
    keep_order: bool = False
    exact_batches: bool = False
    measure_until_s: float | None = None
    keep_series: bool = True
    preemption: bool = False
    protection_s: float = 120.0
    queues: QueueConfig | None = None
    reclaim: bool = True
    elastic: ElasticSimConfig | None = None

    def __post_init__(self) -> None:
        if self.elastic is not None and self.exact_batches:
            raise ValueError("elastic replays place through the pipeline's own pass: exact_batches does not apply")
        if self.power_down_after_s is not None and self.power_down_after_s < 0:
            raise ValueError(f"power_down_after_s must be ≥ 0, got {self.power_down_after_s}")
        if self.wake_delay_s < 0:
            raise ValueError(f"wake_delay_s must be ≥ 0, got {self.wake_delay_s}")
        if self.spare_nodes < 0:
            raise ValueError(f"spare_nodes must be ≥ 0, got {self.spare_nodes}")


@dataclass(frozen=True, slots=True)
class SimResult:
    """What a replay produced.

    :param policy: the policy replayed.
    :param metrics: the summary (time-weighted metrics and job statistics; ``during_arrivals``
        holds the time-weighted ones up to the last arrival).
    :param jobs: one record per finished job, in completion order.
    :param placements: ``job id → node ids`` chosen for each finished job.
    :param series: samples for plots (None unless ``keep_series``).
    :param events: events processed.
    :param preempted: ``job id → (times preempted, run seconds lost)``.
    :param runs: every run of every job, in the order they ended (a job still running at the end
        has none for that run).
    """

    policy: str
    metrics: dict[str, Any]
    jobs: list[JobRecord]
    placements: dict[str, tuple[str, ...]]
    series: Series | None
    events: int
    preempted: dict[str, tuple[int, float]] = field(default_factory=dict)
    runs: list[JobRun] = field(default_factory=list)


class Simulator:
    """Replays jobs on a cluster with one policy.

    :param cluster: the nodes at the start (every node powered on, nothing reserved).
    :param jobs: the jobs; ``request.task_id`` must be unique.
    :param config: how to replay.

    Example::

        result = Simulator(cluster, jobs, SimConfig("power-efficient", power_down_after_s=600)).run()
        print(result.metrics["energy_kwh"])
    """

    def __init__(self, cluster: ClusterSnapshot, jobs: Sequence[SimJob], config: SimConfig) -> None:
        self.config = config
        self.jobs = list(jobs)
        self.base = cluster
        self.now = min((j.request.submit_s for j in self.jobs), default=0.0)
        policy: Policy
        if config.policy == time_aware.NAME:
            # Expected run times come from the trace; the policy reads the virtual clock.
            policy = time_aware.build(config.threshold, mode=config.threshold_mode, now=lambda: self.now)
        else:
            policy = build_policy(config.policy, config.threshold, seed=config.seed, mode=config.threshold_mode)
        self.engine = PlacementEngine(cluster, policy)
        nodes = cluster.nodes
        self.index = {node.node_id: i for i, node in enumerate(nodes)}
        self.start_s = self.now
        self.metrics = MetricsRecorder(
            [n.capacity.gpus for n in nodes], [n.power.idle_w for n in nodes], [n.power.max_w for n in nodes],
            self.start_s, keep_series=config.keep_series,
            checkpoint_s=max((j.request.submit_s for j in self.jobs), default=None),
        )  # fmt: skip
        self.adaptor: SimAdaptor | None = None
        if config.power_down_after_s is not None:
            self.adaptor = SimAdaptor(nodes, lambda: self.now, lambda i: self.engine.node_snapshot(i), config.threshold,
                                      threshold_mode=config.threshold_mode,
                                      power_down_after_s=config.power_down_after_s,
                                      spare_nodes=config.spare_nodes, boot_s=config.wake_delay_s,
                                      wake_timeout_s=max(600.0, 2 * config.wake_delay_s))
        self.ready = [True] * len(nodes)
        self.powered = [True] * len(nodes)
        self.running_gpus = [0.0] * len(nodes)
        self.running_jobs = [0] * len(nodes)
        self.power_due: float | None = None
        self.events: list[tuple[float, int, int, int]] = []
        self.seq = 0
        # The request each pending job is placed with (an elastic job's at its minimum size).
        self.requests = [j.request for j in self.jobs]
        self.by_task_id = {j.request.task_id: k for k, j in enumerate(self.jobs)}
        self.elastic: SimElastic | None = None
        if config.elastic is not None:
            from coordinator.simulator.elastic import SimElastic

            self.elastic = SimElastic(self, config.elastic)
            self.requests = [self.elastic.first_request(k) or r for k, r in enumerate(self.requests)]
        self.shapes = [r.shape for r in self.requests]
        self.buckets: dict[Shape, list[tuple[QueueKey, int]]] = {}
        self.refused: set[Shape] = set()
        self.waiting = 0
        self.placed: dict[int, Placement] = {}
        self.held: dict[int, Request] = {}   # running job → the request the adaptor was told it holds
        self.start_times: dict[int, float] = {}
        self.placements_by_id: dict[str, tuple[str, ...]] = {}
        self.records: list[JobRecord] = []
        self.processed = 0
        self.job_events = 0  # arrivals and completions still in the heap
        self.runs: list[JobRun] = []
        self.stale: dict[int, int] = {}   # job → completion events of preempted runs still to come (ignored)
        self.armed = False
        self.record: PassRecord | None = None   # what the current step decides (only while :meth:`step` runs)
        managed = config.queues is not None and config.queues.managed
        self.qos: SimPreemption | None = None
        if config.preemption or managed:
            # Reclaim preempts the way priority preemption does (the same bookkeeping).
            from coordinator.qos.preemption import Fits
            from coordinator.simulator.qos import SimPreemption

            self.qos = SimPreemption(self, config.protection_s,
                                     Fits(config.policy, config.threshold, config.threshold_mode))
        self.queues: SimQueues | None = None
        if managed and config.queues is not None and self.qos is not None:
            from coordinator.simulator.queues import SimQueues

            qos = self.qos
            # Reclaim stops a borrower through the replay's preemption (looked up at each call).
            self.queues = SimQueues(self, config.queues, reclaim=config.reclaim,
                                    preempt=lambda k, now: qos.preempt(k, now))
            # Priority preemption stays within a queue, for what the queues' plan admitted and left waiting.
            qos.waiting, qos.allowed = self.queues.left_waiting, self.queues.may_preempt
            if self.elastic is not None:
                self.elastic.queues = self.queues

    def _push(self, t: float, kind: int, payload: int) -> None:
        """Schedule an event (payload: a job index; unused for a power step)."""
        self.seq += 1
        if kind < _POWER:
            self.job_events += 1
        heapq.heappush(self.events, (t, kind, self.seq, payload))

    def run(self, progress: Callable[[float], None] | None = None) -> SimResult:
        """Replay every job, until the last arrival, start or completion.

        :param progress: called now and then with the fraction of jobs finished (0..1).
        :returns: the result.
        """
        self._arm()
        every = max(1, len(self.jobs) // 100)
        until, events, advance = self.config.measure_until_s, self.events, self._advance
        while self.job_events or (self.waiting and events):   # :meth:`_more`, inline: the replay's hot loop
            advance(progress, every, until)
        if progress is not None:
            progress(1.0)
        return self._result()

    def step(self) -> PassRecord | None:
        """Process the next timestamp of the replay — its completions, arrivals and power changes, then one
        scheduling pass (with preemption and reclaim after it) — and return what it decided; None once the replay
        is over. :meth:`run` is ``step`` until None, then :meth:`result`.

        Example (one pass on given inputs: every job submitted at ``t``)::

            sim = Simulator(cluster, jobs, SimConfig("max-utilization", elastic=..., keep_series=False))
            record = sim.step()          # record.now == t
            record.started               # task id → Placement of every run the pass started
            record.stopped               # task id → "preempted" | "resized"
            record.waiting               # task ids still pending, in queue order
        """
        self._arm()
        if not self._more():
            return None
        self.record = PassRecord(self.events[0][0])
        try:
            self._advance(None, 1, self.config.measure_until_s)
            record = self.record
        finally:
            self.record = None
        record.waiting = [self.jobs[k].request.task_id for k in self.pending()]
        return record

    def result(self) -> SimResult:
        """The replay's result so far (after :meth:`step` returned None: what :meth:`run` returns)."""
        return self._result()

    def _arm(self) -> None:
        """Queue every job's arrival (once)."""
        if self.armed:
            return
        self.armed = True
        for k, job in enumerate(self.jobs):
            self._push(job.request.submit_s, _ARRIVE, k)

    def _more(self) -> bool:
        """Whether the replay goes on: until the last job event, or the last power step a waiting job may still
        need (a node booting for it); later steps change nothing that matters, and would only stretch the
        horizon."""
        return bool(self.job_events or (self.waiting and self.events))

    def _advance(self, progress: Callable[[float], None] | None, every: int, until: float | None) -> None:
        """Apply every event of the next timestamp, then one pass (module docstring); ``until``: the config's
        ``measure_until_s``."""
        events = self.events
        now = events[0][0]
        self.now = now
        self.metrics.advance(now if until is None else min(now, until))
        released = arrived = ticked = False
        while events and events[0][0] == now:
            _, kind, _, payload = heapq.heappop(events)
            self.processed += 1
            if kind == _COMPLETE and self.elastic is not None and self.elastic.stale_completion(payload, now):
                continue   # the end of a run that was resized (no longer counted as a job event since)
            if kind < _POWER:
                self.job_events -= 1
            if kind == _COMPLETE:
                self._complete(payload, now)
                released = True
                if progress is not None and len(self.records) % every == 0:
                    progress(len(self.records) / len(self.jobs))
            elif kind == _ARRIVE:
                self._arrive(payload)
                arrived = True
            elif kind == _TICK:
                ticked = True
        grew = self._power_step() if self.adaptor is not None else False
        if released or arrived or grew or ticked:
            self.schedule(now, released or grew)
            if self.qos is not None and self.config.preemption:
                self.qos.after_pass(now)
            if self.queues is not None:
                self.queues.after_pass(now)
        if self.adaptor is not None:
            self._power_step()
            self._arm_power_step(now)
        self.metrics.sample(now, self.waiting)

    def _arrive(self, k: int) -> None:
        """Queue job ``k`` in its shape's bucket (ordered by the production queue key)."""
        heapq.heappush(self.buckets.setdefault(self.shapes[k], []), (queue_key(self.requests[k]), k))
        self.waiting += 1
        if self.adaptor is not None:
            self.adaptor.arrived(self.requests[k])

    def _power_step(self) -> bool:
        """Step the adaptor, follow its power states; True when a node came back into service."""
        adaptor = self.adaptor
        assert adaptor is not None
        adaptor.step()
        if not adaptor.changed and self.powered == [adaptor.powered(i) for i in range(len(self.powered))]:
            return False
        adaptor.changed = False
        grew = False
        for i in range(len(self.ready)):
            powered = adaptor.powered(i)
            if powered != self.powered[i]:
                self.powered[i] = powered
                self.metrics.set_node(i, powered=powered)
            ready = adaptor.ready(i)
            grew = grew or (ready and not self.ready[i])
        self._sync_view()
        return grew

    def _arm_power_step(self, now: float) -> None:
        """Step the adaptor again when it would next act on its own."""
        assert self.adaptor is not None
        due = self.adaptor.next_due()
        if due is not None and due > now and (self.power_due is None or self.power_due <= now or due < self.power_due):
            self.power_due = due
            self._push(due, _POWER, 0)

    def _sync_view(self) -> None:
        """Rebuild the engine when the set of ready nodes changed (reservations and policy carry over)."""
        assert self.adaptor is not None
        ready = [self.adaptor.ready(i) for i in range(len(self.ready))]
        if ready == self.ready:
            return
        self.ready = ready
        current = self.engine.snapshot().nodes
        nodes = tuple(replace(node, schedulable=ready[i], powered_on=ready[i]) for i, node in enumerate(current))
        self.engine = PlacementEngine(ClusterSnapshot(nodes=nodes, taken_at_s=self.now), self.engine.policy)
        self.refused.clear()

    # ---- the replay's side of the pipeline (coordinator.simulator.ports.Replay) -------------------------------

    def schedule(self, now: float, released: bool, only: Sequence[int] | None = None) -> None:
        """One scheduling pass at ``now`` (with elastic jobs: their passes, sizing and resizes; with team queues:
        the queues' pass); ``only``: a pass over these pending jobs alone (a preemptor, placed ahead of the
        rest)."""
        if released:
            self.refused.clear()   # resources came back: every shape may fit again
        if self.elastic is not None:
            self.elastic.schedule(now, only)
            return
        if self.queues is not None:
            self.queues.schedule(now, only)
            return
        for k in self.place_pending(now) if only is None else self._plan(now, only):
            self.start(k, self.placed[k], now, self.jobs[k].duration_s)

    def place_pending(self, now: float) -> list[int]:
        """Place what the queue's order lets fit now; returns the jobs booked (not started), in the order placed.

        The placement step of :func:`coordinator.scheduler.pipeline.plan_placements` over the pending queue, cheaply
        (module docstring); ``exact_batches`` runs ``plan_placements`` itself."""
        if self.config.exact_batches:
            return self._place_exact(now)
        sorts = self.engine.policy.sorts_requests and not self.config.keep_order
        heads: list[tuple[tuple[float, QueueKey], Shape]] = []
        for shape, bucket in self.buckets.items():
            if bucket and shape not in self.refused:
                key, k = bucket[0]
                heads.append(((-self.requests[k].compute_demand if sorts else 0.0, key), shape))
        heapq.heapify(heads)
        booked: list[int] = []
        while heads:
            (rank, _), shape = heapq.heappop(heads)
            bucket = self.buckets[shape]
            k = bucket[0][1]
            decision = self.engine.place(self.requests[k])
            if not isinstance(decision, Placement):
                self.refused.add(shape)
                if self.adaptor is not None:
                    # Its shape's later jobs need the same nodes: the head stands for them.
                    self.adaptor.unplaced(self.requests[k])
                continue
            heapq.heappop(bucket)   # k is its head: booked without looking it up
            self.waiting -= 1
            self.placed[k] = decision
            booked.append(k)
            if bucket:
                heapq.heappush(heads, ((rank, bucket[0][0]), shape))
        return booked

    def _place_exact(self, now: float) -> list[int]:
        """Reference pass over the whole queue: the pipeline's :func:`plan_placements` with ``place_batch``."""
        return self._plan(now, self.pending())

    def _plan(self, now: float, jobs: Sequence[int]) -> list[int]:
        """The pipeline's :func:`plan_placements` over these pending jobs; returns the jobs it booked, in order."""
        plan = plan_placements(PlacementInputs(now, [PendingTask(self.requests[k]) for k in jobs],
                                               engine_for=lambda _: self.engine, place=self.place))
        booked = []
        for d in plan.decisions:
            if isinstance(d, Placement):
                k = self.by_task_id[d.task_id]
                self.book(k, d, now)
                booked.append(k)
        return booked

    def request(self, k: int) -> Request:
        """The request job ``k`` is placed with while pending."""
        return self.requests[k]

    def job_of(self, task_id: str) -> int:
        """The index of the job with this task id."""
        return self.by_task_id[task_id]

    def pending(self) -> list[int]:
        """Every pending job, in queue order."""
        return [k for _, k in sorted(item for bucket in self.buckets.values() for item in bucket)]

    def heads(self) -> list[int]:
        """The first pending job of every shape, in queue order."""
        return [k for _, k in sorted(bucket[0] for bucket in self.buckets.values() if bucket)]

    def place(self, engine: PlacementEngine, requests: Sequence[Request]) -> list[Decision]:
        """What ``place_batch`` decides over ``requests`` (queue order), skipping the shapes refused since the last
        release (between releases reservations only grow, so they would be refused again); ``exact_batches``:
        ``place_batch`` itself. The adaptor hears of every job refused."""
        if self.config.exact_batches:
            decisions = engine.place_batch(requests, keep_order=self.config.keep_order)
            if self.adaptor is not None:
                for d in decisions:
                    if not isinstance(d, Placement):
                        self.adaptor.unplaced(self.jobs[self.by_task_id[d.task_id]].request)
            return decisions
        order = list(range(len(requests)))
        if engine.policy.sorts_requests and not self.config.keep_order:
            order.sort(key=lambda i: -requests[i].compute_demand)     # stable: queue order among equals
        out: list[Decision | None] = [None] * len(requests)
        for i in order:
            req = requests[i]
            shape = req.shape
            decision = engine.place(req) if shape not in self.refused else None
            if not isinstance(decision, Placement):
                if decision is not None:
                    self.refused.add(shape)
                    if self.adaptor is not None:
                        self.adaptor.unplaced(self.jobs[self.by_task_id[req.task_id]].request)
                decision = decision or Rejection(req.task_id, "its shape was refused since the last release")
            out[i] = decision
        return [d for d in out if d is not None]

    def book(self, k: int, placement: Placement, now: float) -> None:
        """Pending job ``k`` was placed (its reservations taken in the engine): out of its bucket, booked."""
        bucket = self.buckets[self.shapes[k]]
        item = (queue_key(self.requests[k]), k)
        if bucket[0] == item:
            heapq.heappop(bucket)
        else:
            bucket.remove(item)
            heapq.heapify(bucket)
        self.waiting -= 1
        self.placed[k] = placement

    def start(self, k: int, placement: Placement, now: float, run_s: float) -> None:
        """Job ``k`` starts running on ``placement`` (already booked) and ends ``run_s`` later (only ready nodes
        are schedulable: they are up)."""
        self.placed[k] = placement
        self.start_times[k] = now
        if self.record is not None:
            self.record.started[self.jobs[k].request.task_id] = placement
        indices = [self.index[node_id] for node_id in placement.node_ids]
        if self.adaptor is not None:
            # What it holds (an elastic job's placement may be larger than the request it was placed with);
            # the adaptor is told the same when the run ends.
            held = replace(self.requests[k], demand=placement.demand, nodes=len(placement.node_ids))
            self.held[k] = held
            self.adaptor.placed(held, indices)
        for i in indices:
            self._run_on(i, placement.demand.gpus, start=True)
        self._push(now + run_s, _COMPLETE, k)

    def stop(self, k: int, now: float, *, preempted: bool = True, resized: bool = False) -> Placement:
        """Running job ``k`` stops before its end: its reservations go back (every shape may fit again); a
        ``resized`` run's completion event is no longer awaited (the replay does not wait for it)."""
        ran = now - self.start_times[k]
        placement = self._release(k, now, preempted=preempted, resized=resized)
        self.start_times.pop(k)
        if self.record is not None:
            self.record.stopped[self.jobs[k].request.task_id] = "resized" if resized else "preempted"
        if resized or (self.elastic is not None and self.elastic.stopped(k, placement, ran)):
            self.job_events -= 1   # its completion is no longer awaited (the elastic part knows each run's end)
        else:
            self.stale[k] = self.stale.get(k, 0) + 1   # its completion event is ignored when it comes
        self.refused.clear()
        return placement

    def requeue(self, k: int, request: Request | None = None) -> None:
        """Stopped job ``k`` is pending again (with ``request``: placed with that from now on)."""
        if request is not None:
            self.requests[k] = request
            self.shapes[k] = request.shape
        self._arrive(k)

    def tick_at(self, t: float) -> None:
        """Run a pass at ``t`` even if no job event happens then (an elastic job may resize)."""
        self._push(t, _TICK, 0)

    # ---- bookkeeping --------------------------------------------------------------------------------------------

    def _run_on(self, i: int, gpus: float, *, start: bool) -> None:
        """A job using ``gpus`` GPUs starts or stops running on node ``i``."""
        sign = 1 if start else -1
        self.running_jobs[i] += sign
        self.running_gpus[i] += sign * gpus
        if abs(self.running_gpus[i]) < 1e-9:
            self.running_gpus[i] = 0.0
        self.metrics.set_node(i, used_gpus=self.running_gpus[i], busy=self.running_jobs[i] > 0)

    def _complete(self, k: int, now: float) -> None:
        """Job ``k`` ends: release its reservations (the adaptor sees its nodes idle)."""
        if self.stale.get(k):
            self.stale[k] -= 1
            return   # the end of a run that was preempted
        placement = self._release(k, now)
        req = self.jobs[k].request
        start = self.start_times.pop(k)
        energy_j = self.run_energy_j(placement, now - start)
        if self.elastic is not None:
            start, energy_j = self.elastic.finished(k, start, energy_j)
        self.records.append(JobRecord(req.task_id, req.submit_s, start, now, req.compute_demand, energy_j=energy_j))
        self.placements_by_id[req.task_id] = placement.node_ids

    def run_energy_j(self, placement: Placement, seconds: float) -> float:
        """What the GPUs of a placement draw over ``seconds`` (the agent's per-task energy attribution)."""
        power_w = sum(self.metrics.gpu_power_w(self.index[node_id], placement.demand.gpus)
                      for node_id in placement.node_ids)
        return power_w * seconds

    def _release(self, k: int, now: float, preempted: bool = False, resized: bool = False) -> Placement:
        """Job ``k`` stops running (it ended or was preempted): give its reservations back; the adaptor
        sees its nodes idle."""
        if self.queues is not None:
            self.queues.released(k, now)
        placement = self.placed.pop(k)
        self.runs.append(JobRun(k, self.start_times[k], now, placement, preempted, resized))
        req = self.jobs[k].request
        self.engine.release(placement, req.gpu_mem_per_gpu_bytes)
        indices = [self.index[node_id] for node_id in placement.node_ids]
        for i in indices:
            self._run_on(i, placement.demand.gpus, start=False)
        if self.adaptor is not None:
            self.adaptor.finished(self.held.pop(k, req), indices)
        return placement

    def _result(self) -> SimResult:
        """Summarize the replay."""
        summary: dict[str, Any] = {**self.metrics.summary(), **summarize_jobs(self.records, self.waiting)}
        if self.adaptor is not None:
            requests = self.adaptor.provider.requests
            summary["power_offs"] = sum(1 for _, action, _ in requests if action == "power_off")
            summary["power_ons"] = sum(1 for _, action, _ in requests if action == "power_on")
        summary["preemptions"] = self.qos.preemptions if self.qos is not None else 0
        if self.elastic is not None:
            summary.update(self.elastic.summary())
        # The same time-weighted metrics up to the last arrival (before the cluster drains).
        summary["during_arrivals"] = self.metrics.checkpoint or self.metrics.summary()
        return SimResult(
            policy=self.config.policy,
            metrics=summary,
            jobs=self.records,
            placements=self.placements_by_id,
            series=self.metrics.series,
            events=self.processed,
            preempted=self.qos.per_job() if self.qos is not None else {},
            runs=self.runs,
        )
