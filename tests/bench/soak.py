"""Soak: many simulated agents, steady submits and finishes, leader kills; memory, latency, invariants.

Run: ``.venv/bin/python tests/bench/soak.py [--agents 500] [--minutes 10] [--rate 5] [--kill-every 120]``
(``make soak``), or ``--quick`` (50 agents, 1 minute, a kill every 15 s) while developing.

It starts a 3-member embedded etcd and three ``gptrm-coordinator`` processes on loopback
(``--insecure``), then load-generator processes (this file with ``--role generator``) running
the lightweight agent streams of ``bench_ingest`` (register like a real agent with 8 simulated
H100 GPUs, telemetry at 1 Hz, many streams per channel), extended to act like an agent does
(``agent/stream.py`` is the reference): a StartTask is acknowledged and reported RUNNING, then
SUCCEEDED after the task's duration (its argv is ``sleep N``); a StopTask ends it CANCELLED; every
status event is kept until the coordinator acknowledges it and re-sent after a reconnect; each
Register carries the agent's table of running tasks; a Redirect is followed at once, any other
failure tries the next coordinator after a jittered backoff. Nothing runs: the tasks are simulated.

A submitter sends ``--rate`` one-GPU tasks per second through the Admin gRPC API, each with its own
request id, retried with the same id (following the leader hint, with backoff) until
``--submit-deadline``; it records accepted request id → task id, and refusals (an answer other
than "not the leader"/"unavailable", or the deadline passing). Between ``--kill-every`` and two thirds
of the run the leader is killed with -9 every ``--kill-every`` seconds and restarted on its address;
the rest (at least 30 s after the last kill) is the steady phase.

Measured and printed:

- coordinator RSS of each replica every ``--sample-every`` seconds (a table, ``*`` marks the
  leader, ``!`` a restarted process). **Baseline, in the same run**: each coordinator's memory at
  the start of the steady phase against the end of the run (the same process), and the slope
  (MiB per minute, least squares) over the steady phase; flat is a slope near 0;
- decision latency: submit (the task's ``submit_unix_s``) → RUNNING (its history in etcd, written
  when the agent's RUNNING report was applied), p50/p95/p99/max; submit round trips too;
- failover: kill → a replica answering as leader, per kill;
- invariant violations: ``tests/faults/invariants.InvariantChecker`` (sampled every
  ``--sample-every`` seconds, settled at the end with the accepted submits). Simulated agents have
  no state directory, so the host-side checks have nothing to read; the etcd-side ones all run.

Nothing here is asserted: the soak prints what it saw (a violation is printed, not raised).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import math
import os
import random
import signal
import struct
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import grpc.aio
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_util import REPO, percentile, work_dir
from bench_ingest import (
    CONNECT_METHOD,
    GOLDEN,
    Generator,
    _raw,
    generator_main,
    register_message,
    start_generators,
    telemetry_template,
)

from common.pb.gptrm.v1 import admin_pb2, admin_pb2_grpc, agent_pb2, types_pb2
from common.types import TERMINAL_STATES, TaskState
from coordinator.etcd_embedded import EtcdCluster
from coordinator.rpc_metadata import LEADER_METADATA_KEY
from tests.faults.invariants import InvariantChecker
from tests.integration.harness import Cluster

COORDINATORS = ("c1", "c2", "c3")
GIB = 1 << 30
RUNNING = int(TaskState.RUNNING)


# ---- simulated agents (--role generator) ---------------------------------------------------------------------------

class _Redirected(Exception):
    def __init__(self, address: str) -> None:
        super().__init__(address)
        self.address = address


@dataclass
class SimAgent:
    """What one simulated agent keeps across reconnects: its tasks and its unacknowledged events."""

    k: int
    tasks: dict[str, str] = field(default_factory=dict)            # running task id → decision id
    timers: dict[str, asyncio.TimerHandle] = field(default_factory=dict)
    outbox: list[agent_pb2.TaskStatus] = field(default_factory=list)
    seq: int = 0
    decisions: dict[str, agent_pb2.DecisionAck] = field(default_factory=dict)   # at most once, like the agent
    acks: list[agent_pb2.DecisionAck] = field(default_factory=list)
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    sessions: int = 0        # sessions welcomed so far
    epoch: int = 0           # the leader epoch of the last welcome
    lost_epoch: int = 0      # like the agent's Register.lost_leader_epoch
    report_s: float = 1.0    # the report interval in force (Welcome, then TelemetryRate pushes), as the agent
    # The last session outcomes: (wall time, "welcome" | "redirect ADDRESS" | "failed REASON", coordinator asked).
    history: collections.deque = field(default_factory=lambda: collections.deque(maxlen=12))

    def emit(self, task_id: str, state: TaskState, decision_id: str = "", reason: str = "") -> None:
        self.seq += 1
        status = agent_pb2.TaskStatus(task_id=task_id, state=int(state), pids=[100000 + self.seq],
                                      reason=reason, time_unix_s=time.time(), event_seq=self.seq,
                                      decision_id=decision_id)
        if state in TERMINAL_STATES:
            status.exit_code, status.has_exit_code = 0, True
        self.outbox.append(status)
        self.wakeup.set()

    def register(self) -> bytes:
        if not self.tasks and not self.lost_epoch:
            return register_message(self.k)
        msg = agent_pb2.AgentMessage.FromString(register_message(self.k))
        msg.register.lost_leader_epoch = self.lost_epoch
        msg.register.tasks.extend(agent_pb2.TaskStatus(task_id=t, state=RUNNING, decision_id=d,
                                                       time_unix_s=time.time()) for t, d in self.tasks.items())
        return msg.SerializeToString()


def task_duration(start: agent_pb2.StartTask) -> float:
    """Seconds a simulated task runs: N of ``sleep N`` (0 for anything else)."""
    argv = list(start.argv)
    try:
        return max(0.0, float(argv[1])) if len(argv) == 2 and argv[0] == "sleep" else 0.0
    except ValueError:
        return 0.0


class SoakGenerator(Generator):
    """:class:`bench_ingest.Generator` whose streams act on decisions and survive leader changes.

    :param targets: every coordinator address; agent ``k`` starts at ``targets[k % len]``.
    """

    def __init__(self, targets: list[str], per_channel: int, interval_s: float, backoff_max_s: float,
                 redirect_jitter_s: float = 0.0) -> None:
        super().__init__(targets[0], per_channel, interval_s, heartbeats=False)
        self.targets = targets
        self.backoff_max_s = backoff_max_s
        self.redirect_jitter_s = redirect_jitter_s   # like the agent's --redirect-jitter
        self.pools: dict[tuple[str, int], grpc.aio.Channel] = {}
        self.sims: dict[int, SimAgent] = {}
        self.counts = dict.fromkeys(("starts", "finished", "cancelled", "reconnects", "redirects", "acks",
                                     "events_sent", "events_acked"), 0)
        # Failed sessions by reason (a gRPC status code or an exception type): how many, and the longest one, s.
        self.failures: dict[str, int] = {}
        self.failure_max_s: dict[str, float] = {}

    def _channel(self) -> int:   # type: ignore[override]
        """The agent's channel slot: agents of one slot share one connection per coordinator address."""
        slot = self.agents // self.per_channel
        self.agents += 1
        return slot

    def _pool(self, address: str, slot: int) -> grpc.aio.Channel:
        ch = self.pools.get((address, slot))
        if ch is None:
            ch = self.pools[(address, slot)] = grpc.aio.insecure_channel(address, options=[
                ("grpc.use_local_subchannel_pool", 1), ("grpc.max_receive_message_length", 16 << 20)])
        return ch

    async def _agent(self, k: int, slot: int, ready: asyncio.Future) -> None:   # type: ignore[override]
        sim = self.sims.setdefault(k, SimAgent(k))
        rng = random.Random(k)
        at = k % len(self.targets)
        redirect = ""
        attempt = 0
        first = True
        while True:
            address = redirect or self.targets[at % len(self.targets)]
            redirect = ""
            began = time.monotonic()
            sessions = sim.sessions
            try:
                await self._session(sim, self._pool(address, slot), ready)
            except _Redirected as r:
                self.counts["redirects"] += 1
                redirect = r.address
                sim.history.append((time.time(), f"redirect {r.address or '(none)'}", address))
            except (grpc.aio.AioRpcError, ConnectionError, TimeoutError, asyncio.InvalidStateError) as e:
                # InvalidStateError: a write raced the end of the call (the coordinator went away mid-write).
                if first and not ready.done():
                    print(f"agent {k}: {e!r}"[:300], file=sys.stderr, flush=True)
                self.errors += 1
                reason = e.code().name if isinstance(e, grpc.aio.AioRpcError) else type(e).__name__
                detail = (e.details() or "") if isinstance(e, grpc.aio.AioRpcError) else str(e)
                sim.history.append((time.time(), f"failed {reason} {detail[:60]}", address))
                self.failures[reason] = self.failures.get(reason, 0) + 1
                self.failure_max_s[reason] = max(self.failure_max_s.get(reason, 0.0), time.monotonic() - began)
            except asyncio.CancelledError:
                if not ready.done():
                    ready.set_result(False)
                raise
            first = False
            if sim.sessions != sessions:
                # Like the agent: a welcome resets the backoff, and a welcomed session that broke (not a
                # redirect to a named leader) makes the next standby hold this agent until a new leader is known.
                attempt = 0
                if not redirect:
                    sim.lost_epoch = sim.epoch
            if redirect:
                if self.redirect_jitter_s > 0:
                    await asyncio.sleep(rng.uniform(0, self.redirect_jitter_s))
                continue
            at += 1
            attempt += 1
            cap = min(self.backoff_max_s, 0.1 * 2 ** min(attempt, 10))
            await asyncio.sleep(rng.uniform(cap / 2, cap))

    async def _session(self, sim: SimAgent, channel: grpc.aio.Channel, ready: asyncio.Future) -> None:
        # The semaphore paces sending registrations; the answer is awaited outside it, as independent agents
        # would (a standby may hold an agent until a new leader is known).
        async with self._sem:
            call = channel.stream_stream(CONNECT_METHOD, request_serializer=_raw,
                                         response_deserializer=agent_pb2.CoordinatorMessage.FromString)()
            try:
                await call.write(sim.register())
            except BaseException:
                call.cancel()
                raise
        try:
            first = await asyncio.wait_for(call.read(), timeout=20)
        except BaseException:
            call.cancel()
            raise
        if first is grpc.aio.EOF:
            call.cancel()
            raise ConnectionError("stream closed before welcome")
        if first.HasField("redirect"):
            call.cancel()
            raise _Redirected(first.redirect.leader_address)
        if not first.HasField("welcome"):
            call.cancel()
            raise ConnectionError("first coordinator message was not a welcome")
        sim.sessions += 1
        sim.history.append((time.time(), "welcome", first.welcome.coordinator_id))
        sim.epoch, sim.lost_epoch = first.welcome.leader_epoch, 0
        sim.report_s = max(self.interval_s, first.welcome.report_interval_s)
        self.connected += 1
        if ready.done():
            self.counts["reconnects"] += 1
        else:
            ready.set_result(True)
        reader = asyncio.create_task(self._read(sim, call))
        try:
            await self._write(sim, call, reader)
        finally:
            self.connected -= 1
            reader.cancel()
            call.cancel()
        if reader.done() and not reader.cancelled() and reader.exception():
            raise reader.exception()  # type: ignore[misc]

    async def _write(self, sim: SimAgent, call: grpc.aio.StreamStreamCall, reader: asyncio.Task) -> None:
        templates = [telemetry_template(sim.k, v) for v in range(2)]
        sent_seq = 0
        n = 0
        due = math.floor(time.time()) + (sim.k * GOLDEN) % 1.0 * sim.report_s
        while due < time.time():
            due += sim.report_s
        while not reader.done():
            while sim.acks:
                await call.write(agent_pb2.AgentMessage(decision_ack=sim.acks.pop(0)).SerializeToString())
            for event in [e for e in sim.outbox if e.event_seq > sent_seq]:
                await call.write(agent_pb2.AgentMessage(task_status=event).SerializeToString())
                sent_seq = event.event_seq
                self.counts["events_sent"] += 1
            if time.time() >= due:
                prefix, suffix = templates[n % 2]
                await call.write(prefix + struct.pack("<d", time.time()) + suffix)
                self.sent += 1
                n += 1
                due += sim.report_s
                if time.time() > due:   # could not keep up: skip the missed ticks
                    missed = math.floor((time.time() - due) / sim.report_s) + 1
                    self.skipped += missed
                    due += missed * sim.report_s
            sim.wakeup.clear()
            if sim.acks or any(e.event_seq > sent_seq for e in sim.outbox):
                continue
            wait = asyncio.create_task(sim.wakeup.wait())
            await asyncio.wait({wait, reader}, timeout=max(0.0, due - time.time()),
                               return_when=asyncio.FIRST_COMPLETED)
            wait.cancel()

    async def _read(self, sim: SimAgent, call: grpc.aio.StreamStreamCall) -> None:
        while True:
            msg = await call.read()
            if msg is grpc.aio.EOF:
                raise ConnectionError("coordinator closed the stream")
            which = msg.WhichOneof("body")
            if which == "event_ack":
                before = len(sim.outbox)
                sim.outbox = [e for e in sim.outbox if e.event_seq > msg.event_ack.up_to_seq]
                self.counts["events_acked"] += before - len(sim.outbox)
            elif which == "decision":
                sim.acks.append(self._decide(sim, msg.decision))
                self.counts["acks"] += 1
                sim.wakeup.set()
            elif which == "redirect":
                raise _Redirected(msg.redirect.leader_address)
            elif which == "telemetry_rate":
                sim.report_s = max(self.interval_s, msg.telemetry_rate.report_interval_s)

    def _decide(self, sim: SimAgent, d: agent_pb2.Decision) -> agent_pb2.DecisionAck:
        """Carry out one decision at most once (a re-delivery gets the recorded answer)."""
        if d.decision_id and d.decision_id in sim.decisions:
            return sim.decisions[d.decision_id]
        action = d.WhichOneof("action")
        ack = agent_pb2.DecisionAck(decision_id=d.decision_id, ok=True)
        if action == "start":
            tid = d.start.task_id
            ack.task_id = tid
            ack.resulting_state = RUNNING
            if tid not in sim.tasks:
                sim.tasks[tid] = d.decision_id
                sim.emit(tid, TaskState.RUNNING, d.decision_id)
                sim.timers[tid] = asyncio.get_running_loop().call_later(
                    task_duration(d.start), self._finish, sim, tid, TaskState.SUCCEEDED, "")
                self.counts["starts"] += 1
        elif action == "stop":
            tid = d.stop.task_id
            ack.task_id = tid
            if tid in sim.tasks:
                sim.timers.pop(tid).cancel()
                self._finish(sim, tid, TaskState.CANCELLED, "stopped by the coordinator")
                ack.resulting_state = int(TaskState.CANCELLED)
            else:
                ack.ok, ack.reason = False, f"task {tid!r} is not running on this node"
        elif action in ("pause", "resume", "scale"):
            ack.ok, ack.reason = False, f"{action} is not simulated"
        else:
            ack.resulting_state = RUNNING   # set_power_limit: nothing to do on simulated GPUs
        if d.decision_id:
            sim.decisions[d.decision_id] = ack
        return ack

    def _finish(self, sim: SimAgent, tid: str, state: TaskState, reason: str) -> None:
        if sim.tasks.pop(tid, None) is None:
            return
        sim.timers.pop(tid, None)
        sim.emit(tid, state, reason=reason)
        self.counts["finished" if state == TaskState.SUCCEEDED else "cancelled"] += 1

    def stats(self) -> dict:
        out = super().stats()
        out.update(self.counts, running=sum(len(s.tasks) for s in self.sims.values()),
                   unacked=sum(len(s.outbox) for s in self.sims.values()), failures=dict(self.failures),
                   failure_max_s=dict(self.failure_max_s))
        return out

    def trace(self, since: float, slowest: int) -> list[dict]:
        """The ``slowest`` agents to be welcomed again after wall time ``since`` (never: first), with their
        session outcomes since then."""
        def welcomed(sim: SimAgent) -> float:
            return next((t for t, what, _ in sim.history if t >= since and what == "welcome"), math.inf)
        sims = sorted(self.sims.values(), key=welcomed, reverse=True)[:slowest]
        return [{"agent": sim.k, "welcomed": welcomed(sim) - since if welcomed(sim) != math.inf else None,
                 "history": [(round(t - since, 2), what, at) for t, what, at in sim.history if t >= since]}
                for sim in sims]

    async def close(self) -> None:
        for t in list(self.tasks):
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for ch in self.pools.values():
            await ch.close()


# ---- submitter -----------------------------------------------------------------------------------------------------

class Submitter:
    """Steady submits through the Admin API; a submit is retried with its request id until its deadline.

    :param addresses: every coordinator address.
    :param deadline_s: how long one submit may keep retrying across a leader change.
    """

    def __init__(self, addresses: list[str], deadline_s: float, rng: random.Random,
                 durations: tuple[float, float]) -> None:
        self.addresses = addresses
        self.deadline_s = deadline_s
        self.rng = rng
        self.durations = durations
        self.channels = {a: grpc.aio.insecure_channel(a) for a in addresses}
        self.accepted: dict[str, str] = {}
        self.round_trips: list[float] = []
        self.refused: list[tuple[str, str]] = []
        self.retries = 0     # tries after an unavailable coordinator or no leader
        self.followed = 0    # tries that followed a standby's leader hint
        self.n = 0

    async def submit(self) -> None:
        self.n += 1
        rid = uuid.uuid4().hex
        seconds = round(self.rng.uniform(*self.durations), 1)
        spec = types_pb2.TaskSpec(name=f"soak-{self.n}", argv=["sleep", f"{seconds:g}"], has_demand=True,
                                  demand=types_pb2.ResourceVector(gpus=1, gpu_mem_bytes=GIB, cpu_cores=0.1))
        request = admin_pb2.SubmitTaskRequest(spec=spec, request_id=rid)
        t0 = time.monotonic()
        at = self.rng.randrange(len(self.addresses))
        hint = ""
        attempt = 0
        while True:
            address = hint or self.addresses[at % len(self.addresses)]
            hint = ""
            try:
                task = await admin_pb2_grpc.AdminStub(self.channels[address]).SubmitTask(request, timeout=10)
                self.accepted[rid] = task.id
                self.round_trips.append(time.monotonic() - t0)
                return
            except grpc.aio.AioRpcError as e:
                code = e.code()
                if code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                                grpc.StatusCode.FAILED_PRECONDITION):
                    self.refused.append((rid, f"{code.name}: {e.details()}"[:200]))
                    return
                hint = next((v for k, v in (e.trailing_metadata() or ()) if k == LEADER_METADATA_KEY), "")
                if time.monotonic() - t0 > self.deadline_s:
                    self.refused.append((rid, f"deadline {self.deadline_s:g}s passed: {code.name}: "
                                              f"{e.details()}"[:200]))
                    return
                if hint and hint != address:
                    self.followed += 1
                    continue
                self.retries += 1
                at += 1
                attempt += 1
                await asyncio.sleep(self.rng.uniform(0.05, min(2.0, 0.1 * 2 ** attempt)))

    async def close(self) -> None:
        for ch in self.channels.values():
            await ch.close()


# ---- orchestrator --------------------------------------------------------------------------------------------------

@dataclass
class MemRow:
    t: float
    rss: dict[str, float]
    pids: dict[str, int]
    leader: str


async def leader_of(cluster: Cluster) -> str:
    """The name of the one replica answering as leader ("" when none or several)."""
    async def ask(name: str) -> bool:
        if not cluster.proc(name).alive:
            return False
        with contextlib.suppress(grpc.aio.AioRpcError):
            async with grpc.aio.insecure_channel(cluster.address(name)) as ch:
                s = await admin_pb2_grpc.AdminStub(ch).GetStatus(admin_pb2.GetStatusRequest(), timeout=2)
                return s.is_leader
        return False
    leading = [n for n, ok in zip(COORDINATORS, await asyncio.gather(*(ask(n) for n in COORDINATORS)), strict=True)
               if ok]
    return leading[0] if len(leading) == 1 else ""


async def wait_for_leader(cluster: Cluster, timeout_s: float) -> str:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        name = await leader_of(cluster)
        if name:
            return name
        await asyncio.sleep(0.1)
    raise TimeoutError(f"no leader within {timeout_s:g}s")


def rss_mib(pid: int) -> float:
    try:
        return psutil.Process(pid).memory_info().rss / 2**20
    except psutil.Error:
        return math.nan


def slope_per_min(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MiB) points, in MiB per minute (NaN under 3 points)."""
    pts = [(t, v) for t, v in points if not math.isnan(v)]
    if len(pts) < 3:
        return math.nan
    mt = sum(t for t, _ in pts) / len(pts)
    mv = sum(v for _, v in pts) / len(pts)
    den = sum((t - mt) ** 2 for t, _ in pts)
    return 60.0 * sum((t - mt) * (v - mv) for t, v in pts) / den if den else math.nan


def _ms(x: float) -> str:
    return "-" if math.isnan(x) else f"{x * 1000:.0f}ms"


async def orchestrate(args: argparse.Namespace, tmp: Path) -> None:
    duration = args.minutes * 60.0
    kill_window = 2 * duration / 3
    kill_at = [t for t in (args.kill_every * i for i in range(1, 1000)) if t < kill_window] if args.kill_every else []
    steady_from = max(kill_window, (kill_at[-1] + 30) if kill_at else 0.0)
    print(f"soak: {args.agents} simulated agents x 8 GPUs, {args.generators} generator process(es), submits "
          f"{args.rate:g}/s of 1-GPU tasks running {args.min_task:g}-{args.max_task:g}s, {args.minutes:g} min, "
          f"leader kill -9 at {[round(t) for t in kill_at]} s, steady phase from {steady_from:.0f} s; "
          f"{os.cpu_count()} CPUs", flush=True)
    etcd = EtcdCluster(tmp / "etcd", size=3)
    await asyncio.to_thread(etcd.start)
    prefix = f"/soak-{os.getpid()}-{int(time.time())}/"
    cluster = Cluster(tmp, etcd.endpoints, prefix)
    flags = ("--task-grace", str(args.task_grace), *args.coordinator_args.split())
    gens = []
    submitter: Submitter | None = None
    try:
        for name in COORDINATORS:
            cluster.start_coordinator(name, *flags)
        first_leader = await wait_for_leader(cluster, 60)
        addresses = [cluster.address(n) for n in COORDINATORS]
        print(f"coordinators {', '.join(f'{n}={cluster.address(n)}' for n in COORDINATORS)}; {first_leader} leads",
              flush=True)
        gens = await start_generators(args, ",".join(addresses), tmp, "soak", script=Path(__file__).resolve(),
                                      extra=("--backoff-max", str(args.backoff_max)))
        t0 = time.monotonic()
        answers = await asyncio.gather(*(
            g.ask({"cmd": "add", "indices": list(range(args.agents))[i::len(gens)], "timeout_s": 120},
                  timeout_s=200) for i, g in enumerate(gens)))
        failed = sum(a["failed"] for a in answers)
        print(f"{args.agents - failed} of {args.agents} agents registered in {time.monotonic() - t0:.1f}s", flush=True)

        checker = InvariantChecker(etcd.endpoints, prefix, {})
        submitter = Submitter(addresses, args.submit_deadline, random.Random(args.seed),
                              (args.min_task, args.max_task))
        mem: list[MemRow] = []
        kills: list[tuple[float, str, float]] = []   # (time, killed, failover seconds)
        in_flight: set[asyncio.Task] = set()
        start = time.monotonic()
        stats_rows: list[tuple[float, list[dict]]] = []

        async def sample_loop() -> None:
            while True:
                t = time.monotonic() - start
                leader = await leader_of(cluster)
                mem.append(MemRow(t, {n: rss_mib(cluster.proc(n).pid) for n in COORDINATORS},
                                  {n: cluster.proc(n).pid for n in COORDINATORS}, leader))
                stats_rows.append((t, [await g.ask({"cmd": "stats"}, timeout_s=30) for g in gens]))
                await asyncio.to_thread(checker.sample)
                s = stats_rows[-1][1]
                print(f"  t={t:5.0f}s leader={leader or '-':<3} rss " +
                      " ".join(f"{n}={mem[-1].rss[n]:.0f}" for n in COORDINATORS) +
                      f" MiB | accepted {len(submitter.accepted)} refused {len(submitter.refused)} "
                      f"in flight {len(in_flight)} | agents up {sum(x['connected'] for x in s)} "
                      f"running {sum(x['running'] for x in s)} done {sum(x['finished'] for x in s)} "
                      f"skipped ticks {sum(x['skipped'] for x in s)}", flush=True)
                await asyncio.sleep(max(0.0, args.sample_every - (time.monotonic() - start - t)))

        async def kill_loop() -> None:
            for at in kill_at:
                await asyncio.sleep(max(0.0, at - (time.monotonic() - start)))
                victim = await wait_for_leader(cluster, 60)
                t_kill = time.monotonic()
                cluster.proc(victim).kill()
                cluster.start_coordinator(victim, *flags)   # the same address, as a standby
                new = await wait_for_leader(cluster, 120)   # the restarted victim may win again
                kills.append((t_kill - start, victim, time.monotonic() - t_kill))
                print(f"  kill -9 {victim} at t={t_kill - start:.0f}s: {new} leads after "
                      f"{time.monotonic() - t_kill:.2f}s", flush=True)

        sampler = asyncio.create_task(sample_loop())
        killer = asyncio.create_task(kill_loop())
        period = 1.0 / args.rate if args.rate > 0 else 0.0
        due = time.monotonic()
        while time.monotonic() - start < duration:
            if args.rate <= 0:   # telemetry only: the memory baseline without any task
                await asyncio.sleep(duration - (time.monotonic() - start))
                break
            task = asyncio.create_task(submitter.submit())
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
            due += period
            await asyncio.sleep(max(0.0, due - time.monotonic()))
        await asyncio.gather(*in_flight, return_exceptions=True)
        await killer
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
        end_t = time.monotonic() - start
        mem.append(MemRow(end_t, {n: rss_mib(cluster.proc(n).pid) for n in COORDINATORS},
                          {n: cluster.proc(n).pid for n in COORDINATORS}, await leader_of(cluster)))
        print(f"submits stopped at t={end_t:.0f}s; waiting up to {args.max_task + 30:g}s for the running tasks to "
              "finish", flush=True)
        drain_end = time.monotonic() + args.max_task + 30
        while time.monotonic() < drain_end:
            s = [await g.ask({"cmd": "stats"}, timeout_s=30) for g in gens]
            if not any(x["running"] or x["unacked"] for x in s):
                break
            await asyncio.sleep(2)
        print(f"drained at t={time.monotonic() - start:.0f}s; settling the invariant checker", flush=True)
        violations = await asyncio.to_thread(checker.settle, submitter.accepted, args.settle)
        snap = await asyncio.to_thread(checker.snapshot)
        final_stats = [await g.ask({"cmd": "stats"}, timeout_s=30) for g in gens]
        report(args, mem, kills, submitter, snap, violations, final_stats, steady_from, checker.samples)
    finally:
        if submitter is not None:
            await submitter.close()
        for g in gens:
            await g.stop()
        for name in COORDINATORS:
            if name in cluster.coordinators:
                cluster.proc(name).stop()
        await asyncio.to_thread(etcd.stop)


def report(args: argparse.Namespace, mem: list[MemRow], kills: list[tuple[float, str, float]], sub: Submitter,
           snap: object, violations: list, gen_stats: list[dict], steady_from: float, samples: int) -> None:
    print(f"\ncoordinator RSS over time, MiB (* leader, ! a restarted process since the previous row; "
          f"every {args.sample_every:g}s)")
    print(f"{'t s':>6}" + "".join(f"{n:>9}" for n in COORDINATORS))
    prev: MemRow | None = None
    for row in mem:
        cells = []
        for n in COORDINATORS:
            mark = ("*" if row.leader == n else " ") + ("!" if prev is not None and prev.pids[n] != row.pids[n]
                                                         else " ")
            cells.append(f"{row.rss[n]:>7.0f}{mark}")
        print(f"{row.t:>6.0f}" + "".join(cells))
        prev = row
    print(f"\nmemory, steady phase ({steady_from:.0f}s → end, no kills; baseline = the same process at its start):")
    for n in COORDINATORS:
        pid = mem[-1].pids[n]
        pts = [(r.t, r.rss[n]) for r in mem if r.t >= steady_from and r.pids[n] == pid]
        led = sum(r.leader == n for r in mem if r.t >= steady_from)
        if len(pts) < 2:
            print(f"  {n}: too few samples")
            continue
        slope = slope_per_min(pts)
        print(f"  {n}{' (leader)' if led > len(pts) // 2 else ' (standby)'}: {pts[0][1]:.1f} → {pts[-1][1]:.1f} MiB "
              f"({pts[-1][1] - pts[0][1]:+.1f}), slope {slope:+.2f} MiB/min over {len(pts)} samples "
              + (f"= {slope * 1024 / (60 * args.rate):+.1f} KiB per submitted task" if args.rate > 0 else ""))
    tasks = snap.tasks   # type: ignore[attr-defined]
    lat, never = [], 0
    states: dict[str, int] = {}
    for tid in sub.accepted.values():
        task = tasks.get(tid)
        if task is None:
            continue
        label = TaskState(task.state).label
        states[label] = states.get(label, 0) + 1
        running = next((h.time_unix_s for h in task.history if h.state == RUNNING), None)
        if running is None:
            never += 1
        else:
            lat.append(running - task.submit_unix_s)
    print(f"\ndecision latency, submit → RUNNING (etcd history), {len(lat)} tasks: p50 {_ms(percentile(lat, 50))} "
          f"p95 {_ms(percentile(lat, 95))} p99 {_ms(percentile(lat, 99))} max {_ms(max(lat, default=math.nan))}; "
          f"{never} accepted tasks never RUNNING")
    rt = sub.round_trips
    print(f"submit round trip (with retries): p50 {_ms(percentile(rt, 50))} p99 {_ms(percentile(rt, 99))} "
          f"max {_ms(max(rt, default=math.nan))}; {sub.n} submits, {len(sub.accepted)} accepted, "
          f"{len(sub.refused)} refused, {sub.followed} leader hints followed, {sub.retries} retries after no answer "
          "or no leader")
    for rid, why in sub.refused[:5]:
        print(f"  refused {rid}: {why}")
    print(f"final task states: {dict(sorted(states.items()))}")
    fo = [s for _, _, s in kills]
    print(f"leader kills: {len(kills)}; failover (kill → a replica leads) " +
          (f"min {min(fo):.2f}s p50 {percentile(fo, 50):.2f}s max {max(fo):.2f}s" if fo else "-"))
    g = {k: sum(s[k] for s in gen_stats) for k in ("starts", "finished", "cancelled", "reconnects", "redirects",
                                                    "errors", "skipped", "sent", "unacked", "running")}
    print(f"simulated agents: {g['starts']} starts, {g['finished']} succeeded, {g['cancelled']} cancelled, "
          f"{g['running']} still running, {g['unacked']} events unacknowledged; {g['reconnects']} reconnects, "
          f"{g['redirects']} redirects, {g['errors']} stream failures; {g['sent']} telemetry samples, "
          f"{g['skipped']} ticks skipped (generator behind)")
    print(f"invariant violations: {len(violations)} ({samples} samples + the settled check)")
    for v in violations[:10]:
        print(f"  {v}"[:400])


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--agents", type=int, default=500, help="simulated agents (8 GPUs each)")
    p.add_argument("--minutes", type=float, default=10.0, help="length of the submit phase")
    p.add_argument("--rate", type=float, default=5.0, help="submits per second (0: none, telemetry only)")
    p.add_argument("--kill-every", type=float, default=120.0,
                   help="seconds between leader kills (-9), within the first two thirds of the run; 0: none")
    p.add_argument("--quick", action="store_true", help="50 agents, 1 minute, a kill every 20 s (development)")
    p.add_argument("--min-task", type=float, default=20.0, help="shortest simulated task, seconds")
    p.add_argument("--max-task", type=float, default=60.0, help="longest simulated task, seconds")
    p.add_argument("--sample-every", type=float, default=10.0, help="seconds between memory/invariant samples")
    p.add_argument("--submit-deadline", type=float, default=60.0, help="how long one submit keeps retrying")
    p.add_argument("--task-grace", type=float, default=30.0, help="coordinator --task-grace")
    p.add_argument("--settle", type=float, default=60.0, help="seconds the invariant checker may wait to converge")
    p.add_argument("--generators", type=int, default=1, help="load-generator processes")
    p.add_argument("--streams-per-channel", type=int, default=20, help="agent streams per gRPC channel")
    p.add_argument("--interval", type=float, default=1.0, help="telemetry interval of every agent, seconds")
    p.add_argument("--backoff-max", type=float, default=2.0, help="agents' longest reconnect backoff, seconds")
    p.add_argument("--coordinator-args", default="", help="extra coordinator flags, space-separated")
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--keep-dir", default="", help="keep state and logs in this directory instead of a temporary one")
    p.add_argument("--role", choices=("orchestrator", "generator"), default="orchestrator", help=argparse.SUPPRESS)
    p.add_argument("--target", help=argparse.SUPPRESS)
    p.add_argument("--heartbeats", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.quick:
        args.agents, args.minutes, args.kill_every, args.sample_every = 50, 1.0, 15.0, 5.0
    if args.role == "generator":
        gen = SoakGenerator(args.target.split(","), args.streams_per_channel, args.interval, args.backoff_max)
        asyncio.run(generator_main(args, gen))
    else:
        signal.signal(signal.SIGTERM, _interrupted)   # stop the cluster (the finally blocks) on a plain kill
        os.chdir(REPO)
        with work_dir(args.keep_dir, "gptrm-soak-") as tmp:
            asyncio.run(orchestrate(args, tmp))


if __name__ == "__main__":
    main()
