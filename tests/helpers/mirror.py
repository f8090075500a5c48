"""The scheduling mirror: one scenario run through the leader's cycle and through the simulator, each side's
decisions in one plain, comparable form.

A :class:`Scenario` is a cluster (nodes of whole GPUs), team queues (or none) and two waves of jobs: wave 0 arrives
on an idle cluster, is placed and starts running; wave 1 arrives next and is decided against the running wave 0.
Each wave's :class:`Decisions` are the ones one leader cycle makes:

- ``placed``: job → its allocation, ``((node, (GPU indices…)), …)`` (an elastic job's at the size it was given);
- ``resized``: running elastic job → the size its resize aims at;
- ``victims``: the running jobs preempted for a higher-priority job;
- ``reclaimed``: the running jobs whose borrowed GPUs a queue took back.

The leader side (:func:`leader_decisions`) is the coordinator's own object graph (``coordinator.app.build``) on a
real etcd, elected, with none of its loops started: nodes register through the node service, jobs are submitted
through the task table (the jobs of wave 0 that end as wave 1 arrives end then, before its cycle, as their agents
would report),
``SchedulerCycle.cycle()`` runs once per wave, and the decisions are read back from what
etcd stored. Then, as the simulator does at one time, tasks stopping for a preemption or a resize stop at once and
another cycle runs, until none stops; the placed tasks then start (moved to RUNNING as their agents' reports
would). A leader whose cycles stop the same tasks again and again never settles: that is reported as a difference.
The team queues' clock (their decayed usage and fair order) reads the wave's time, as the simulator's does: every
cycle of a wave at its arrival, so that what a queue held from wave 0 to wave 1 is the same on both sides and not
the wall-clock time between the leader's cycles.

The simulator side (:func:`simulator_decisions`) replays the same jobs — the leader's own placement request of each
task — on the leader's own snapshot of the idle cluster, every job of a wave arriving at once, at the wave's last
submit time (a job of wave 0 that ends runs until exactly then; a pass runs then even when nothing arrives, as the
leader's cycle does). It runs to the end of every job; what counts is what it does at each wave's arrival, up to
what one leader cycle decides (its first pass, then its first resizes or its first preemption's victims, and its
first reclaim's victims), told apart by recording its starts, resizes and preemptions in the order they happen.

Ties: the rules break ties by task id, the leader's queue order by submit time. Task ids are made to ascend in
submission order (``t-0000000001``, …, instead of random ones), so that both sides break ties alike, run after run,
and the simulator's queue order among jobs arriving at once (by id) is the leader's (by submit time). Jobs that
started at once on the simulator start one after another on the leader; the latest submitted is started first, so
that "most recently started first" (the order victims and reclaimed borrowers are taken in) is the simulator's
order among equal start times (by id).
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any

import coordinator.tasks
from common.pb.gptrm.v1 import agent_pb2, types_pb2
from common.types import TaskState
from coordinator.app import App, build
from coordinator.config import CoordinatorConfig
from coordinator.domain import ClusterSnapshot, Placement, Request
from coordinator.elastic.rules import ElasticRange, Resize, request_at
from coordinator.queues import Queue, QueueConfig
from coordinator.scheduler.queue import request_for
from coordinator.simulator.elastic import ElasticSimConfig
from coordinator.simulator.engine import SimConfig, SimJob, Simulator
from coordinator.simulator.scaling import ScalingCurve
from coordinator.sync import Keys, connect
from coordinator.sync.client import op_put
from tests.helpers.clock import FakeClock

__all__ = ["Decisions", "Job", "Node", "Scenario", "differences", "leader_decisions", "mirror", "random_scenario",
           "simulator_decisions"]

GIB = 1024**3
GPU_MODELS = ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB")
GPU_MODEL = GPU_MODELS[0]
INTERVAL_S = 600.0
"""Elastic hysteresis of both sides (longer than any scenario takes to run)."""
RESTART_COST_S = 30.0
"""What both sides assume a resize costs."""
_MODEL = "mirror-model"
_CURVE = ScalingCurve(_MODEL, 32, tuple(100.0 * n ** 0.9 for n in range(1, 65)), (1, 2, 4, 8))
"""The simulator's true throughput of every elastic job (it decides only how long a job runs)."""
_RUN_S = 36_000.0


@dataclass(frozen=True, slots=True)
class Node:
    """A node of ``gpus`` whole GPUs of one model."""

    node_id: str
    gpus: int
    model: str = GPU_MODEL


@dataclass(frozen=True, slots=True)
class Job:
    """A job of the scenario.

    :param name: its name (the task's ``spec.name``; decisions are keyed by it).
    :param gpus: whole GPUs on one node (an elastic job: its maximum; its minimum is 1).
    :param priority: its priority (preemption: higher preempts strictly lower).
    :param queue: its team queue ("" without queues).
    :param elastic: resizable between 1 and ``gpus``.
    :param wave: 0 (arrives on the idle cluster) or 1 (arrives once wave 0 runs).
    :param deadline_in_s: a deadline this many seconds after the wave's arrival (0: none), with ``time_limit_s``.
    :param time_limit_s: its time limit (the leader's expected run time when the profiler has none).
    :param ends: a rigid job of wave 0 that, when it runs, ends just as wave 1 arrives (its GPUs free for it).
    :param gpu_model: the GPU model it asks for ("" any).
    :param nodes: nodes it spans (``gpus`` on each).
    """

    name: str
    gpus: int
    priority: int = 0
    queue: str = ""
    elastic: bool = False
    wave: int = 0
    deadline_in_s: float = 0.0
    time_limit_s: float = 0.0
    ends: bool = False
    gpu_model: str = ""
    nodes: int = 1


@dataclass(frozen=True, slots=True)
class Scenario:
    """One mirror input: cluster, queues, jobs and what is switched on."""

    nodes: tuple[Node, ...]
    jobs: tuple[Job, ...]
    policy: str = "max-utilization"
    queues: QueueConfig | None = None
    preemption: bool = False
    elastic: bool = False

    def wave(self, w: int) -> list[Job]:
        """The jobs of wave ``w``, in submission order."""
        return [j for j in self.jobs if j.wave == w]


@dataclass(frozen=True, slots=True)
class Decisions:
    """One cycle's decisions, by job name (module docstring)."""

    placed: Mapping[str, tuple[tuple[str, tuple[int, ...]], ...]] = field(default_factory=dict)
    resized: Mapping[str, int] = field(default_factory=dict)
    victims: frozenset[str] = frozenset()
    reclaimed: frozenset[str] = frozenset()


def mirror(scenario: Scenario, endpoints: list[str], prefix: str) -> list[str]:
    """Run ``scenario`` through both sides; every way their decisions differ, in words (empty: they agree)."""
    run = asyncio.run(leader_decisions(scenario, endpoints, prefix))
    return run.notes + differences(run.decisions, simulator_decisions(scenario, run))


def differences(leader: Sequence[Decisions], sim: Sequence[Decisions]) -> list[str]:
    """Every way the two sides' decisions differ, wave by wave, in words (empty: they agree)."""
    out = []
    for w, (a, b) in enumerate(zip(leader, sim, strict=True)):
        for what in ("placed", "resized"):
            x, y = getattr(a, what), getattr(b, what)
            for name in sorted(set(x) | set(y)):
                if x.get(name) != y.get(name):
                    out.append(f"wave {w} {what} {name}: leader {x.get(name)} ≠ simulator {y.get(name)}")
        for what in ("victims", "reclaimed"):
            x, y = getattr(a, what), getattr(b, what)
            if x != y:
                out.append(f"wave {w} {what}: leader {sorted(x)} ≠ simulator {sorted(y)}")
    return out


# ---- inputs ----------------------------------------------------------------------------------------------------


def random_scenario(seed: int, *, queues: bool = False, preemption: bool = False, elastic: bool = False,
                    gangs: bool = False) -> Scenario:
    """A small random cluster and two waves of jobs, drawn from ``seed``: the first asks for as many GPUs as the
    cluster has (fragments keep some waiting), the second for half as many to one and a half times as many (things
    wait, shrink, preempt and reclaim), or, one time in four, for none (what ends makes room, running elastic jobs
    may grow). With ``preemption``, the second wave's jobs have priority 0, 10 or 20, the first wave's 0. With
    ``queues``, the nodes may have two GPU models, a queue's quota may be in one of them (a pool of its own), and a
    job may ask for one. With ``gangs``, one rigid job in four spans two nodes."""
    rnd = random.Random(seed)
    nodes = tuple(Node(f"n{i}", rnd.choice((2, 4, 4, 8))) for i in range(rnd.randint(2, 4)))
    total = sum(n.gpus for n in nodes)
    names = ("alpha", "beta", "gamma")[:rnd.randint(2, 3)] if queues else ("",)
    models: tuple[str, ...] = (GPU_MODEL,)
    config = None
    if queues:
        models = GPU_MODELS[:rnd.randint(1, 2)]
        nodes = tuple(replace(n, model=rnd.choice(models)) for n in nodes)
        quotas = [{rnd.choice(models) if len(models) > 1 and rnd.random() < 0.5 else "*":
                   rnd.randint(0, total // len(names))} for _ in names]
        config = QueueConfig(queues=tuple(Queue(name, gpus=q, members=("*",), default_for=("*",) if i == 0 else ())
                                          for i, (name, q) in enumerate(zip(names, quotas, strict=True))))
    present = sorted({n.model for n in nodes})
    jobs: list[Job] = []
    for wave, fill in ((0, total), (1, 0 if rnd.random() < 0.25 else rnd.randint(total // 2, total * 3 // 2))):
        asked = 0
        while asked < fill:
            model = rnd.choice(present) if len(present) > 1 and rnd.random() < 0.3 else ""
            widest = max(n.gpus for n in nodes if n.model == model or not model)
            gpus = rnd.choice([g for g in (1, 1, 2, 2, 3, 4, 8) if g <= widest])
            flexible = elastic and rnd.random() < 0.6
            span = 2 if gangs and not flexible and rnd.random() < 0.25 else 1
            gpus = min(gpus, sorted(n.gpus for n in nodes)[-span])
            asked += gpus * span
            jobs.append(Job(f"w{wave}-{len(jobs):02d}", gpus, priority=rnd.choice((0, 10, 20)) if preemption and wave
                            else 0, queue=rnd.choice(names), elastic=flexible, wave=wave,
                            ends=wave == 0 and not flexible and rnd.random() < 0.3, gpu_model=model, nodes=span))
    policy = rnd.choice(("max-utilization", "load-balancing", "first-fit"))
    return Scenario(nodes, tuple(jobs), policy, config, preemption, elastic)


def _spec(job: Job, now: float) -> types_pb2.TaskSpec:
    """The task spec submitted for a job (an elastic one asks for its minimum, as ``gptrmctl submit --gpus 1:N``)."""
    spec = types_pb2.TaskSpec(name=job.name, argv=["true"], kind=types_pb2.TASK_KIND_TRAINING,
                              restart_policy=types_pb2.RESTART_POLICY_NEVER, priority=job.priority, has_demand=True,
                              demand=types_pb2.ResourceVector(gpus=1 if job.elastic else job.gpus, cpu_cores=1,
                                                              mem_bytes=GIB))
    if job.elastic:
        spec.elastic.min_gpus, spec.elastic.max_gpus = 1, job.gpus
    if job.queue:
        spec.queue = job.queue
    if job.gpu_model:
        spec.constraints.gpu_model = job.gpu_model
    if job.nodes > 1:
        spec.nodes = job.nodes
    if job.deadline_in_s:
        spec.qos.deadline_unix_s = now + job.deadline_in_s
    if job.time_limit_s:
        spec.time_limit_s = job.time_limit_s
    return spec


# ---- the leader ------------------------------------------------------------------------------------------------


class ManualRole:
    """Takes over as the coordinator's own duties do (the stored state adopted, queues and reservations recovered)
    but starts none of the leader's loops: the test runs each cycle itself."""

    def __init__(self, app: App) -> None:
        self.app = app

    async def take_over(self, record: types_pb2.LeaderRecord) -> bool:
        """Adopt what etcd holds (nothing but the queues, in a fresh prefix)."""
        app = self.app
        state = await asyncio.to_thread(app.store.load_all)
        app.state.adopt(state.tasks, state.nodes, state.allocations)
        await app.queue_admin.recover()
        await app.reservations.recover()
        return True

    def start_leading(self) -> None:
        return None

    def stand_down(self, reason: str) -> None:
        return None


@contextmanager
def _task_ids(n: int) -> Iterator[None]:
    """The task submitted now gets the id ``t-`` + ``n`` in ten hex digits instead of a random one: ids ascend in
    submission order, so that the rules, which break ties by task id, break them the same way on both sides and run
    after run, and the simulator's tie-break in queue order (the id) is the leader's (the submit time)."""
    real = coordinator.tasks.uuid
    coordinator.tasks.uuid = SimpleNamespace(uuid4=lambda: uuid.UUID(int=n << 88))  # type: ignore[assignment]
    try:
        yield
    finally:
        coordinator.tasks.uuid = real


@dataclass
class LeaderRun:
    """What the leader side produced: per wave, its decisions; the stored tasks; the cluster it scheduled on."""

    decisions: list[Decisions]
    tasks: dict[str, types_pb2.Task]          # name → the task as submitted (id, submit time, spec)
    cluster: ClusterSnapshot                   # the leader's snapshot of the idle cluster
    arrivals: list[float]                      # per wave, the time its cycle ran
    notes: list[str] = field(default_factory=list)   # what kept the leader from settling (module docstring)


async def _wait(check: Callable[[], bool], timeout_s: float = 15.0) -> None:
    """Wait until ``check()`` holds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not check():
        assert loop.time() < deadline, "timed out waiting for the leader"
        await asyncio.sleep(0.02)


def _leader_wave(app: App, names: Mapping[str, str], before: Mapping[str, types_pb2.Task]) -> Decisions:
    """The decisions of the cycle that just ran, from what etcd stored (``before``: the tasks before it)."""
    stored = app.store.load_all().tasks
    placed: dict[str, tuple[tuple[str, tuple[int, ...]], ...]] = {}
    resized: dict[str, int] = {}
    victims, reclaimed = set(), set()
    for task_id, task in stored.items():
        name = names.get(task_id)
        if name is None or task_id not in before:   # not the scenario's, or ended before the cycle
            continue
        was = before[task_id].state
        if was == TaskState.PENDING and task.state in (TaskState.SCHEDULED, TaskState.PREEMPTED):
            # (a task placed and reclaimed in one cycle is both)
            placed[name] = tuple((na.node_id, tuple(na.gpu_indices)) for na in task.allocation.nodes)
        if task.state == TaskState.PREEMPTED and was != TaskState.PREEMPTED:
            if task.reason.startswith("resizing"):
                resized[name] = task.elastic.target_gpus
            elif task.reason.startswith("Preempted: reclaimed"):
                reclaimed.add(name)
            else:
                victims.add(name)
    return Decisions(placed, resized, frozenset(victims), frozenset(reclaimed))


async def _settle(app: App, submitted: Sequence[types_pb2.Task], names: Mapping[str, str]) -> str:
    """What the simulator does at one time after its first pass, on the leader: tasks stopping for a preemption or
    a resize stop at once (back in the queue, their GPUs released, as the agents' reports would have them) and
    another cycle runs, until none stops; then the placed tasks start (latest submitted first: module docstring).
    Returns "" or, when cycles stop the same tasks again and again, what they stop in words."""
    seen: set[frozenset[str]] = set()
    note = ""
    while True:
        stopping = [t for t in app.tasks.live() if t.state == TaskState.PREEMPTED]
        if not stopping:
            break
        ids = frozenset(t.id for t in stopping)
        if ids in seen:
            note = (f"the leader's cycles stop {sorted(names[i] for i in ids)} again and again "
                    f"({stopping[0].reason!r})")
            break
        seen.add(ids)
        for task in stopping:
            await app.tasks.transition(task.id, TaskState.PENDING, "stopped", release=True)
        await app.cycle.cycle()
    rank = {task.id: i for i, task in enumerate(submitted)}
    for task in sorted(app.tasks.live(), key=lambda t: rank.get(t.id, -1), reverse=True):
        if task.state == TaskState.SCHEDULED:
            await app.tasks.transition(task.id, TaskState.STARTING, "starting")
            await app.tasks.transition(task.id, TaskState.RUNNING, "started")
    return note


async def leader_decisions(scenario: Scenario, endpoints: list[str], prefix: str) -> LeaderRun:
    """Run ``scenario`` through the leader: its app on the real etcd at ``endpoints`` under ``prefix``, one
    scheduling cycle per wave (module docstring)."""
    client = connect(endpoints, 2.0)
    keys = Keys(prefix)
    if scenario.queues is not None:
        client.txn([], [op_put(keys.queues, json.dumps(scenario.queues.to_dict()).encode())])
    # A lease long enough that a loaded machine does not lose it mid-scenario (resigned at the end).
    cfg = CoordinatorConfig(etcd_prefix=prefix, policy=scenario.policy, lease_ttl_s=10.0, task_grace_s=3600.0,
                            lost_grace_s=3600.0, heartbeat_interval_s=600.0, elastic_interval_s=INTERVAL_S,
                            elastic_restart_cost_s=RESTART_COST_S, metrics_listen="")
    app = build(cfg, client)
    clock = FakeClock(time.time())
    app.queues.clock = clock   # queue usage accrues in the waves' time, as in the simulator (module docstring)
    loop = asyncio.get_running_loop()
    app.loop = loop
    app.leadership.start(ManualRole(app), loop)
    try:
        await _wait(lambda: app.leadership.is_leader)
        for node in scenario.nodes:
            inv = types_pb2.NodeInventory(
                node_id=node.node_id, cpu_cores=64, mem_total_bytes=512 * GIB, disk_total_bytes=2000 * GIB,
                task_port_min=30000, task_port_max=30099,
                gpus=[types_pb2.GpuInfo(index=i, model=node.model, mem_total_bytes=80 * GIB, uuid=f"{node.node_id}-{i}")
                      for i in range(node.gpus)])
            await app.nodes.connected(agent_pb2.Register(inventory=inv), asyncio.Queue())
        cluster = app.snapshots.snapshot([], app.registry)
        names: dict[str, str] = {}
        submitted: dict[str, types_pb2.Task] = {}
        decisions: list[Decisions] = []
        arrivals: list[float] = []
        notes: list[str] = []
        start = 1
        for w in (0, 1):
            now = time.time()
            for job in scenario.wave(w):
                with _task_ids(start):
                    task = await app.tasks.submit(_spec(job, now), f"mirror-{job.name}", queue=job.queue)
                start += 1
                names[task.id] = job.name
                submitted[job.name] = task
            arrivals.append(max((submitted[j.name].submit_unix_s for j in scenario.wave(w)), default=time.time()))
            clock.t = arrivals[w]
            for job in scenario.wave(0) if w == 1 else ():   # they end as wave 1 arrives (at its time)
                task = app.tasks.find(submitted[job.name].id)
                if job.ends and task is not None and task.state == TaskState.RUNNING:   # as its agent reports
                    await app.tasks.transition(task.id, TaskState.SUCCEEDED, "", release=True, exit_code=0)
            before = {t.id: t for t in app.tasks.live()}
            await app.cycle.cycle()
            decisions.append(await asyncio.to_thread(_leader_wave, app, names, before))
            note = await _settle(app, list(submitted.values()), names)
            if note:
                notes.append(f"wave {w}: {note}")
        return LeaderRun(decisions, submitted, cluster, arrivals, notes)
    finally:
        await app.leadership.resign()
        client.close()


# ---- the simulator ---------------------------------------------------------------------------------------------


@dataclass
class _Log:
    """What the simulator did, in order: ``(time, kind, job index, detail)``."""

    entries: list[tuple[float, str, int, Any]] = field(default_factory=list)
    reclaiming: bool = False


@contextmanager
def _recording(sim: Simulator, log: _Log) -> Iterator[None]:
    """Record the simulator's starts, resizes and preemptions (its methods wrapped on this instance only; a run
    starts through ``start``, or ``_start`` where the simulator has no public one)."""
    name = "start" if hasattr(sim, "start") else "_start"
    start = getattr(sim, name)

    def _start(k: int, placement: Placement, now: float, run_s: float) -> None:
        log.entries.append((now, "start", k, placement))
        start(k, placement, now, run_s)

    setattr(sim, name, _start)
    if sim.qos is not None:
        preempt = sim.qos.preempt

        def _preempt(k: int, now: float) -> None:
            log.entries.append((now, "reclaim" if log.reclaiming else "preempt", k, None))
            preempt(k, now)

        sim.qos.preempt = _preempt  # type: ignore[method-assign]
        one = sim.qos._one

        def _one(now: float) -> bool:   # one preemptor's victims per call
            log.entries.append((now, "round", -1, None))
            return one(now)

        sim.qos._one = _one  # type: ignore[method-assign]
    if sim.queues is not None:
        after = sim.queues.after_pass
        if hasattr(sim.queues, "preempt"):   # the queues stop their reclaim's victims through a preempt of their own
            stop = sim.queues.preempt

            def _reclaim(k: int, now: float) -> None:
                log.entries.append((now, "reclaim", k, None))
                stop(k, now)

            sim.queues.preempt = _reclaim

        def _after(now: float) -> None:
            log.reclaiming = True
            try:
                after(now)
            finally:
                log.reclaiming = False

        sim.queues.after_pass = _after  # type: ignore[method-assign]
    if sim.elastic is not None:
        resize = sim.elastic._resize

        def _resize(k: int, decision: Resize, now: float) -> None:
            log.entries.append((now, "resize", k, decision.to_gpus))
            resize(k, decision, now)

        sim.elastic._resize = _resize  # type: ignore[method-assign]
    yield


def sim_jobs(scenario: Scenario, run: LeaderRun) -> list[SimJob]:
    """The scenario's jobs as the simulator replays them: the leader's own placement request of each task (its
    id, demand, priority and deadline), every job of a wave arriving at the wave's last submit time (the leader's
    tie-break, its submit time, becomes the simulator's, the task id: both ascend in submission order)."""
    out = []
    for job in scenario.jobs:
        task = run.tasks[job.name]
        req: Request = request_for(task, job.time_limit_s or None)
        if job.elastic:   # the simulator's elastic range is 1 up to the GPUs its job asks for
            req = request_at(req, elastic_range_of(job), job.gpus)
        out.append(SimJob(replace(req, submit_s=run.arrivals[job.wave]), _ending(*run.arrivals) if job.ends else _RUN_S,
                          job.queue))
    return out


def _ending(start: float, end: float) -> float:
    """A run time that, started at ``start``, ends exactly at ``end`` (in floating point)."""
    run_s = end - start
    while start + run_s != end:
        run_s = math.nextafter(run_s, math.inf if start + run_s < end else -math.inf)
    return run_s


def sim_config(scenario: Scenario) -> SimConfig:
    """The simulator's options for the scenario: its policy, preemption, queues, elastic jobs."""
    elastic = None
    if scenario.elastic:
        elastic = ElasticSimConfig(curves={_MODEL: _CURVE}, models=tuple(_MODEL if j.elastic else ""
                                                                         for j in scenario.jobs),
                                   max_factor=1.0, min_gpus=1, interval_s=INTERVAL_S, restart_cost_s=RESTART_COST_S)
    return SimConfig(scenario.policy, preemption=scenario.preemption, queues=scenario.queues, elastic=elastic,
                     keep_series=False)


def simulator_decisions(scenario: Scenario, run: LeaderRun) -> list[Decisions]:
    """Run ``scenario`` through the simulator with the leader's inputs (module docstring); its first-pass decisions
    at each wave's arrival."""
    jobs = sim_jobs(scenario, run)
    sim = Simulator(run.cluster, jobs, sim_config(scenario))
    # a pass at wave 1 even when nothing arrives or ends then, as the leader's cycle runs
    (getattr(sim, "tick_at", None) or sim._tick_at)(run.arrivals[1])
    log = _Log()
    with _recording(sim, log):
        sim.run()
    names = {k: job.name for k, job in enumerate(scenario.jobs)}
    return [_first_pass([e for e in log.entries if e[0] == at], names) for at in run.arrivals]


def _first_pass(entries: Sequence[tuple[float, str, int, Any]], names: Mapping[int, str]) -> Decisions:
    """The decisions of one leader cycle among what the simulator did at one time: the starts of its first pass,
    then its first resizes (of the first elastic step), or the victims of its first preemption, and the first
    victims of its reclaim."""
    placed: dict[str, tuple[tuple[str, tuple[int, ...]], ...]] = {}
    resized: dict[str, int] = {}
    victims: set[str] = set()
    reclaimed: set[str] = set()
    i, n = 0, len(entries)
    while i < n and entries[i][1] == "start":
        placed[names[entries[i][2]]] = tuple((a.node_id, tuple(a.gpu_indices)) for a in entries[i][3].assignments)
        i += 1
    while i < n and entries[i][1] == "round" and (i + 1 == n or entries[i + 1][1] != "preempt"):
        i += 1   # a preemption round that found no victims
    if i < n and entries[i][1] == "resize":
        while i < n and entries[i][1] == "resize":
            resized[names[entries[i][2]]] = entries[i][3]
            i += 1
    elif i < n and entries[i][1] == "round":
        i += 1
        while i < n and entries[i][1] == "preempt":
            victims.add(names[entries[i][2]])
            i += 1
    while i < n and entries[i][1] != "reclaim":
        i += 1
    while i < n and entries[i][1] == "reclaim":
        reclaimed.add(names[entries[i][2]])
        i += 1
    return Decisions(placed, resized, frozenset(victims), frozenset(reclaimed))


def elastic_range_of(job: Job) -> ElasticRange:
    """The range both sides give an elastic job."""
    return ElasticRange(1, job.gpus, job.gpus)
