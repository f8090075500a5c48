"""The discrete-event loop: replay jobs against a simulated cluster in virtual time.

Decisions come from the coordinator's own code: the pending queue is ordered by
:func:`common.domain.queue_key`, and every placement is made by the production
:class:`coordinator.scheduler.placement.engine.PlacementEngine` (policy filter and rank, then the Resource
Allocator's GPU choice). The engine lives for the whole replay: placements reserve in it and
finished jobs :meth:`~coordinator.scheduler.placement.engine.PlacementEngine.release` their reservations, so no
snapshot is rebuilt per event (only when the elastic pool below changes).

Events live in one ``heapq``. Everything that happens at one virtual time — completions,
delayed starts, arrivals — is applied first, then **one** scheduling pass runs, then idle nodes
whose power-down timer expired are powered down (after the pass, so a node that just received
work stays up).

A pass decides what ``place_batch(queue)`` would, cheaply. Between releases reservations only
grow, so a request refused once stays refused until something is released: the pass groups the
queue by *shape* (identical demand and constraints), tries each shape's head in the order
``place_batch`` uses (descending compute demand for Alg. 1-3 — a stable sort over queue order —
queue order for the baselines), and stops trying a shape at its first refusal. A pass after
pure arrivals therefore tries only the new shapes. Refusals consume no randomness and move no
round-robin cursor, so the decisions equal those of ``place_batch`` over the whole queue;
``SimConfig(exact_batches=True)`` does exactly that, and the tests compare both.

Priorities and preemption (``SimConfig(preemption=True)``): after each pass the QoS Manager's
victim choice runs on the refused high-priority jobs; see :mod:`coordinator.simulator.qos`.

Power states (see :mod:`coordinator.adaptor.power_states`): busy, idle, and off after
``power_down_after_s`` without work; work placed on an off node starts ``wake_delay_s`` later
(a gang when its last node is up). With ``scale_out`` the policies that ask for new nodes
(Alg. 1-2) see only powered nodes, and a scale-out refusal powers on the smallest off nodes
that could hold the request.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from common.domain import ClusterSnapshot, Placement, Rejection, Request, queue_key
from coordinator.adaptor.power_states import NodePower
from coordinator.scheduler.placement.engine import PlacementEngine
from coordinator.scheduler.policies import feasible
from coordinator.simulator.metrics import JobRecord, MetricsRecorder, Series, summarize_jobs

if TYPE_CHECKING:
    from coordinator.simulator.qos import SimPreemption

__all__ = ["SimConfig", "SimJob", "SimResult", "Simulator", "shape_of"]

# event kinds; at one timestamp they are applied in this order
_COMPLETE, _START, _ARRIVE, _POWER_DOWN = 0, 1, 2, 3

Shape = tuple[Any, ...]
"""Everything about a request that the placement decision depends on, except its identity."""
QueueKey = tuple[int, float, float, str]
""":func:`common.domain.queue_key` of a request."""


def shape_of(req: Request) -> Shape:
    """The request's shape: two requests with equal shapes are accepted by the same nodes.

    :param req: a request.
    :returns: a hashable key.
    """
    return (
        req.demand.as_tuple(), req.nodes, req.gpu_mem_per_gpu_bytes, req.constraint_key, req.allow_sharing,
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class SimJob:
    """One job to replay.

    :param request: what the placement engine sees (``submit_s`` is the arrival time).
    :param duration_s: run time once started.
    """

    request: Request
    duration_s: float


@dataclass(frozen=True, slots=True)
class SimConfig:
    """How to replay.

    :param policy: policy name from :data:`coordinator.scheduler.policies.POLICIES`.
    :param threshold: cap on each dimension's utilization after placement, in (0, 1]. 1.0 by
        default: at 0.9 an 8-GPU server could never take an 8-GPU trace job.
    :param seed: seed for the ``random`` policy.
    :param power_down_after_s: power a node down after this long without work (None: never).
    :param wake_delay_s: time from powering a node on until its jobs start.
    :param scale_out: elastic pool for policies that ask for new nodes (needs ``power_down_after_s``).
    :param keep_order: decide in queue order also for the policies that sort by demand (FIFO).
    :param exact_batches: reference mode: hand the whole queue to ``place_batch`` on every pass.
    :param measure_until_s: stop the time-weighted metrics here (None: at the last event); job
        statistics always cover every job.
    :param keep_series: record samples per timestamp for plots.
    :param preemption: let higher-priority jobs preempt lower-priority ones (:mod:`coordinator.simulator.qos`).
    :param protection_s: a job is not preempted again within this many seconds.
    """

    policy: str
    threshold: float = 1.0
    seed: int = 0
    power_down_after_s: float | None = None
    wake_delay_s: float = 0.0
    scale_out: bool = False
    keep_order: bool = False
    exact_batches: bool = False
    measure_until_s: float | None = None
    keep_series: bool = True
    preemption: bool = False
    protection_s: float = 120.0

    def __post_init__(self) -> None:
        if self.power_down_after_s is not None and self.power_down_after_s < 0:
            raise ValueError(f"power_down_after_s must be ≥ 0, got {self.power_down_after_s}")
        if self.wake_delay_s < 0:
            raise ValueError(f"wake_delay_s must be ≥ 0, got {self.wake_delay_s}")


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
    :param preempted: ``job id → (times preempted, run seconds lost)`` of the jobs preempted at least once.
    """

    policy: str
    metrics: dict[str, Any]
    jobs: list[JobRecord]
    placements: dict[str, tuple[str, ...]]
    series: Series | None
    events: int
    preempted: dict[str, tuple[int, float]] = field(default_factory=dict)


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
        self.engine = PlacementEngine.from_name(cluster, config.policy, threshold=config.threshold, seed=config.seed)
        self.elastic = config.scale_out and self.engine.policy.scale_out and config.power_down_after_s is not None
        nodes = cluster.nodes
        self.index = {node.node_id: i for i, node in enumerate(nodes)}
        self.start_s = min((j.request.submit_s for j in self.jobs), default=0.0)
        self.metrics = MetricsRecorder(
            [n.capacity.gpus for n in nodes], [n.power.idle_w for n in nodes], [n.power.max_w for n in nodes],
            self.start_s, keep_series=config.keep_series,
            checkpoint_s=max((j.request.submit_s for j in self.jobs), default=None),
        )  # fmt: skip
        self.nodes = NodePower(len(nodes), self.start_s, self.metrics, config.power_down_after_s, config.wake_delay_s)
        self.events: list[tuple[float, int, int, int]] = []
        self.seq = 0
        self.shapes = [shape_of(j.request) for j in self.jobs]
        self.buckets: dict[Shape, list[tuple[QueueKey, int]]] = {}
        self.refused: set[Shape] = set()
        self.waiting = 0
        self.placed: dict[int, Placement] = {}
        self.start_times: dict[int, float] = {}
        self.placements_by_id: dict[str, tuple[str, ...]] = {}
        self.records: list[JobRecord] = []
        self.processed = 0
        self.job_events = 0  # arrivals, starts and completions still in the heap
        self.scale_outs = 0
        self.qos: SimPreemption | None = None
        if config.preemption:
            from coordinator.simulator.qos import SimPreemption

            self.qos = SimPreemption(self, config.protection_s)

    def _push(self, t: float, kind: int, payload: int) -> None:
        """Schedule an event (payload: a job index, or a node index for power-down)."""
        self.seq += 1
        if kind != _POWER_DOWN:
            self.job_events += 1
        heapq.heappush(self.events, (t, kind, self.seq, payload))

    def run(self, progress: Callable[[float], None] | None = None) -> SimResult:
        """Replay every job, until the last arrival, start or completion.

        :param progress: called now and then with the fraction of jobs finished (0..1).
        :returns: the result.
        """
        for k, job in enumerate(self.jobs):
            self._push(job.request.submit_s, _ARRIVE, k)
        if self.config.power_down_after_s is not None:
            for i in range(len(self.base.nodes)):
                self._push(self.start_s + self.config.power_down_after_s, _POWER_DOWN, i)
        step = max(1, len(self.jobs) // 100)
        until = self.config.measure_until_s
        events = self.events
        # The replay ends with the last job event: power-down timers left over after it change
        # nothing that matters, and would only stretch the horizon.
        while self.job_events:
            now = events[0][0]
            self.metrics.advance(now if until is None else min(now, until))
            released = arrived = False
            power_downs: list[int] = []
            while events and events[0][0] == now:
                _, kind, _, payload = heapq.heappop(events)
                self.processed += 1
                if kind != _POWER_DOWN:
                    self.job_events -= 1
                if kind == _COMPLETE:
                    self._complete(payload, now)
                    released = True
                    if progress is not None and len(self.records) % step == 0:
                        progress(len(self.records) / len(self.jobs))
                elif kind == _START:
                    self._start(payload)
                elif kind == _ARRIVE:
                    self._arrive(payload)
                    arrived = True
                else:
                    power_downs.append(payload)
            if released or arrived:
                self._schedule(now, released)
                if self.qos is not None:
                    self.qos.after_pass(now)
            for i in power_downs:
                self.nodes.power_down(i, now, elastic=self.elastic)
            self.metrics.sample(now, self.waiting)
        if progress is not None:
            progress(1.0)
        return self._result()

    def _arrive(self, k: int) -> None:
        """Queue job ``k`` in its shape's bucket (ordered by the production queue key)."""
        heapq.heappush(self.buckets.setdefault(self.shapes[k], []), (queue_key(self.jobs[k].request), k))
        self.waiting += 1

    def _sync_view(self) -> None:
        """Rebuild the engine when the elastic pool changed (reservations carry over)."""
        if not self.nodes.view_changed:
            return
        in_view = self.nodes.in_view
        current = self.engine.snapshot().nodes
        nodes = tuple(replace(node, schedulable=in_view[i]) for i, node in enumerate(current))
        # The policy object carries over: Alg. 1-2 are stateless, and only they run elastic.
        self.engine = PlacementEngine(ClusterSnapshot(nodes=nodes, taken_at_s=0.0), self.engine.policy)
        self.nodes.view_changed = False

    def _schedule(self, now: float, released: bool) -> None:
        """One scheduling pass at ``now``."""
        if released:
            # Resources came back: every shape may fit again.
            self.refused.clear()
        self._sync_view()
        if self.config.exact_batches:
            self._schedule_exact(now)
            return
        sorts = self.engine.policy.sorts_requests and not self.config.keep_order
        heads: list[tuple[tuple[float, QueueKey], Shape]] = []
        for shape, bucket in self.buckets.items():
            if bucket and shape not in self.refused:
                key, k = bucket[0]
                heads.append(((-self.jobs[k].request.compute_demand if sorts else 0.0, key), shape))
        heapq.heapify(heads)
        while heads:
            (rank, _), shape = heapq.heappop(heads)
            bucket = self.buckets[shape]
            k = bucket[0][1]
            decision = self._decide(self.jobs[k].request, now)
            if not isinstance(decision, Placement):
                self.refused.add(shape)
                continue
            heapq.heappop(bucket)
            self._placed(k, decision, now)
            if bucket:
                heapq.heappush(heads, ((rank, bucket[0][0]), shape))

    def _decide(self, req: Request, now: float) -> Placement | Rejection:
        """The engine's decision; in elastic mode a scale-out refusal powers nodes on and retries once."""
        decision = self.engine.place(req)
        if isinstance(decision, Placement) or not (self.elastic and decision.scale_out):
            return decision
        if not self._scale_out(req, now):
            return decision
        self.refused.clear()  # the pool grew: room came back
        return self.engine.place(req)

    def _scale_out(self, req: Request, now: float) -> bool:
        """Power on ``req.nodes`` off nodes that could hold the request when empty.

        Like a node provider asked for a node that fits, take the smallest ones (fewest GPUs,
        then least idle power, then node order), so a small request does not take a big server.
        """
        threshold = self.engine.policy.threshold
        candidates = [
            (node.capacity.gpus, node.power.idle_w, i) for i, node in enumerate(self.base.nodes)
            if not self.nodes.in_view[i] and feasible(req, node, threshold) is None
        ]  # fmt: skip
        if len(candidates) < req.nodes:
            return False
        for _, _, i in sorted(candidates)[: req.nodes]:
            self.nodes.power_on(i, now)
            # A new node the retry leaves unused (a gang may need fewer) is taken back like any idle one.
            self._push(now + (self.config.power_down_after_s or 0.0), _POWER_DOWN, i)
        self.scale_outs += 1
        self._sync_view()
        return True

    def _schedule_exact(self, now: float) -> None:
        """Reference pass over the whole queue: ``place_batch`` itself, or — in elastic mode, where
        a refusal may grow the pool mid-batch — ``place`` per request in ``place_batch``'s order."""
        queue = sorted(item for bucket in self.buckets.values() for item in bucket)
        requests = [self.jobs[k].request for _, k in queue]
        if self.elastic:
            order = range(len(queue))
            if self.engine.policy.sorts_requests and not self.config.keep_order:
                order = sorted(order, key=lambda n: -requests[n].compute_demand)
            for n in order:
                decision = self._decide(requests[n], now)
                if isinstance(decision, Placement):
                    self._book_exact(queue[n], decision, now)
            return
        for item, decision in zip(queue, self.engine.place_batch(requests, keep_order=self.config.keep_order),
                                  strict=True):
            if isinstance(decision, Placement):
                self._book_exact(item, decision, now)

    def _book_exact(self, item: tuple[QueueKey, int], placement: Placement, now: float) -> None:
        """Take a job placed by the reference pass out of its bucket and book it."""
        key, k = item
        bucket = self.buckets[self.shapes[k]]
        bucket.remove((key, k))
        heapq.heapify(bucket)
        self._placed(k, placement, now)

    def _placed(self, k: int, placement: Placement, now: float) -> None:
        """Book a placement: wake off nodes, then start the job now or when its last node is up."""
        self.waiting -= 1
        self.placed[k] = placement
        start = now
        for node_id in placement.node_ids:
            start = max(start, self.nodes.book(self.index[node_id], now))
        self.start_times[k] = start
        if start > now:
            self._push(start, _START, k)
        else:
            self._start(k)

    def _start(self, k: int) -> None:
        """Job ``k`` begins running: its GPUs count as busy until it completes."""
        placement = self.placed[k]
        for node_id in placement.node_ids:
            self.nodes.run(self.index[node_id], placement.demand.gpus, start=True)
        self._push(self.start_times[k] + self.jobs[k].duration_s, _COMPLETE, k)

    def _complete(self, k: int, now: float) -> None:
        """Job ``k`` ends: release its reservations and arm the power-down timers of emptied nodes."""
        if self.qos is not None and self.qos.stale_completion(k):
            return   # the end of a run that was preempted
        placement = self._release(k, now)
        req = self.jobs[k].request
        self.records.append(JobRecord(req.task_id, req.submit_s, self.start_times.pop(k), now, req.compute_demand))
        self.placements_by_id[req.task_id] = placement.node_ids

    def _release(self, k: int, now: float) -> Placement:
        """Job ``k`` stops running (it ended or was preempted): give its reservations back and arm the
        power-down timers of emptied nodes."""
        placement = self.placed.pop(k)
        self.engine.release(placement, self.jobs[k].request.gpu_mem_per_gpu_bytes)
        for node_id in placement.node_ids:
            i = self.index[node_id]
            self.nodes.run(i, placement.demand.gpus, start=False)
            if self.nodes.unbook(i, now):
                self._push(now + (self.config.power_down_after_s or 0.0), _POWER_DOWN, i)
        return placement

    def _result(self) -> SimResult:
        """Summarize the replay."""
        summary: dict[str, Any] = {**self.metrics.summary(), **summarize_jobs(self.records, self.waiting)}
        summary["scale_outs"] = self.scale_outs
        summary["preemptions"] = self.qos.preemptions if self.qos is not None else 0
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
        )
