"""Benchmark: the whole submit → RUNNING path at a sustained rate, with many clients and a fleet.

Run: ``.venv/bin/python tests/bench/bench_throughput.py [--rate 500] [--duration 60] [--clients 192]
[--agents 24] [--retain 100000]``. The defaults: 192 callers, so that the accepted rate is the leader's and not
the callers' (each waits for its answer, so together they submit at most their number ÷ SubmitTask's latency:
with 96 and the 90–100 ms a call takes near 1,000/s, about 960/s); 24 agents (1,536
task slots of 0.125 GPU), so that 500 one-second tasks a second fit under the default GPU threshold. With
``--agents 8`` (512 slots) the fleet runs fewer tasks a second than are submitted and a queue builds up behind
it, as when a sweep is submitted faster than the cluster runs it: the accepted rate then shows what a long queue
costs the leader (the tick lines and ``most PENDING at once`` show how long it got).

It starts a 3-member etcd (``EtcdCluster``; ``--etcd-members``), one real ``gptrm-coordinator`` process (the
leader, its event-loop thread in the real-time class the installed unit gives it: ``--loop-priority``;
``--standby`` adds a second replica) and, in this process, a fleet of ``--agents`` simulated
agents that speak the real agent stream protocol over gRPC: each registers 8 simulated GPUs,
and for every ``StartTask`` decision reports STARTING and RUNNING and acknowledges the
decision (as ``agent/runtime.py`` does), ends the task SUCCEEDED after ``--task-seconds``,
and sends one telemetry sample every ``--telemetry-interval`` seconds (a heartbeat meanwhile). Like the
agent's writer, it sends what it has queued together as one ``Reports`` message, and reads ``Decisions``.
Load comes from a separate client process (this file with ``--role clients``) that runs
``--clients`` concurrent ``SubmitTask`` callers over ``--channels`` gRPC connections, each
pacing itself to its share of ``--rate`` (open loop: a caller behind its schedule submits at once).

Measured:

- ``submits/s``: SubmitTask calls answered OK during the ``--duration`` window, per second;
- ``running/s``: tasks whose RUNNING report the coordinator acknowledged during the window (the
  agent's ``EventAck`` comes only once the RUNNING transition is stored in etcd), per second;
- submit → RUNNING: the time of that acknowledgement minus the time the SubmitTask call returned
  (both clocks this host's), p50/p99 over every task submitted in the window;
- the leader's RSS with ``--retain`` finished tasks retained: that many SUCCEEDED task records are
  written to etcd before the coordinator starts (it loads them as any new leader would, and keeps
  them: ``--finished-retention-count`` is raised above it), and the RSS is read after the load;
- ``gptrmctl tasks``: the time to its first output line and to its end, human table and ``-o json``,
  with every retained task listed.

The last line reads ``sustained: submits/s=N running/s=N p99_submit_to_running_s=X``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import grpc.aio
import psutil
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_util import BIN, REPO, Proc, coordinator_argv, free_port, percentile, wait_leader, work_dir

from common.pb.gptrm.v1 import admin_pb2, admin_pb2_grpc, agent_pb2, agent_pb2_grpc, types_pb2
from common.pbenum import pb_enum
from common.types import MAX_REPORTS
from coordinator import loop_priority
from coordinator.etcd_embedded import EtcdCluster

GIB = 1 << 30
GPUS = 8
RUNNING = types_pb2.TASK_STATE_RUNNING


def task_spec(i: int, args: argparse.Namespace) -> types_pb2.TaskSpec:
    demand = types_pb2.ResourceVector(gpus=args.gpus, gpu_mem_bytes=int(args.gpu_mem_gib * GIB),
                                      cpu_cores=args.cpu_cores)
    return types_pb2.TaskSpec(name=f"tp-{i}", kind=types_pb2.TASK_KIND_INFERENCE, argv=["sleep", "1"],
                              has_demand=True, demand=demand, allow_gpu_sharing=True)


OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]
"""Channel option: a connection of the channel's own, not one shared with other channels to the same address."""


# ---- the client process ----------------------------------------------------------------------------------------------

async def _clients(args: argparse.Namespace) -> None:
    """``--clients`` callers at ``--rate`` for ``--duration`` from ``--start-at``; one JSON document to ``--out``."""
    # Each channel its own connection (gRPC otherwise shares one between channels to the same address), as
    # many users' clients would be.
    channels = [grpc.aio.insecure_channel(args.address, options=OWN_CONNECTION)
                for _ in range(max(1, min(args.channels, args.clients)))]
    stubs = [admin_pb2_grpc.AdminStub(c) for c in channels]
    returned: list[tuple[str, float, float]] = []   # (task id, call start, call return)
    errors: dict[str, int] = {}
    share = args.rate / args.clients
    start, end = args.start_at, args.start_at + args.duration

    async def caller(k: int) -> None:
        stub = stubs[k % len(stubs)]
        n = 0
        while True:
            due = start + (n + k / args.clients) / share
            if due >= end or time.time() >= end:   # behind schedule: what was not sent in the window is not
                return
            if (delay := due - time.time()) > 0:
                await asyncio.sleep(delay)
            i = n * args.clients + k
            n += 1
            t0 = time.time()
            try:
                task = await stub.SubmitTask(admin_pb2.SubmitTaskRequest(spec=task_spec(i, args),
                                                                         request_id=f"tp-{args.run_id}-{i}"),
                                             timeout=30)
            except grpc.aio.AioRpcError as e:
                errors[e.code().name] = errors.get(e.code().name, 0) + 1
                continue
            returned.append((task.id, t0, time.time()))

    await asyncio.gather(*(caller(k) for k in range(args.clients)))
    for c in channels:
        await c.close()
    Path(args.out).write_text(json.dumps({"returned": returned, "errors": errors, "cpu_s": time.process_time()}))


# ---- the simulated fleet ---------------------------------------------------------------------------------------------

@dataclass
class Fleet:
    """What the simulated agents saw: when each task's RUNNING was acknowledged, and message counts."""

    running_at: dict[str, float] = field(default_factory=dict)
    started: int = 0
    ended: int = 0
    stream_errors: int = 0
    read: dict[str, int] = field(default_factory=dict)    # stream messages the agents read, by body
    written: int = 0                                      # stream messages the agents wrote


class SimAgent:
    """One simulated agent on the real AgentGateway stream."""

    def __init__(self, k: int, channel: grpc.aio.Channel, fleet: Fleet, args: argparse.Namespace) -> None:
        self.node_id = f"tp-agent-{k:03d}"
        self._stub = agent_pb2_grpc.AgentGatewayStub(channel)
        self._fleet, self._args = fleet, args
        self._out: asyncio.Queue[agent_pb2.AgentMessage] = asyncio.Queue()
        self._seq = 0
        self._pending_running: dict[int, str] = {}   # event seq → task id, until acknowledged
        self._running: dict[str, str] = {}            # task id → start decision id
        self._ends: set[asyncio.Task] = set()

    def _inventory(self) -> types_pb2.NodeInventory:
        gpus = [types_pb2.GpuInfo(index=i, uuid=f"GPU-{self.node_id}-{i}", model="H100-80GB", mem_total_bytes=80 * GIB,
                                  power_limit_w=700) for i in range(GPUS)]
        return types_pb2.NodeInventory(node_id=self.node_id, hostname=self.node_id, gpus=gpus, cpu_cores=256,
                                       mem_total_bytes=2048 * GIB, simulated=True, gpu_backend="simulated",
                                       advertise_address="127.0.0.1")

    def _sample(self) -> agent_pb2.AgentMessage:
        now = time.time()
        gpus = [types_pb2.GpuSample(index=i, uuid=f"GPU-{self.node_id}-{i}", util_gpu=0.3, mem_used_bytes=GIB,
                                    mem_total_bytes=80 * GIB, power_w=200.0, power_limit_w=700.0, temperature_c=40,
                                    healthy=True, simulated=True) for i in range(GPUS)]
        host = types_pb2.HostSample(cpu_util=0.1, mem_used_bytes=8 * GIB, mem_total_bytes=2048 * GIB)
        sample = types_pb2.TelemetrySample(time_unix_s=now, gpus=gpus, host=host, simulated=True)
        return agent_pb2.AgentMessage(telemetry=agent_pb2.TelemetryBatch(samples=[sample]))

    def _status(self, task_id: str, state: int, decision_id: str, *, exit_code: int | None = None,
                reason: str = "") -> int:
        self._seq += 1
        status = agent_pb2.TaskStatus(task_id=task_id, state=pb_enum(types_pb2.TaskState, state),
                                      pids=[10_000 + self._seq], time_unix_s=time.time(), event_seq=self._seq,
                                      decision_id=decision_id, reason=reason)
        if exit_code is not None:
            status.exit_code, status.has_exit_code = exit_code, True
        self._out.put_nowait(agent_pb2.AgentMessage(task_status=status))
        return self._seq

    async def _end_later(self, task_id: str) -> None:
        await asyncio.sleep(self._args.task_seconds)
        decision_id = self._running.pop(task_id, None)
        if decision_id is not None:
            self._status(task_id, types_pb2.TASK_STATE_SUCCEEDED, decision_id, exit_code=0)
            self._fleet.ended += 1

    def _decide(self, d: agent_pb2.Decision) -> None:
        which = d.WhichOneof("action")
        if which == "start":
            tid = d.start.task_id
            if tid not in self._running:
                self._running[tid] = d.decision_id
                self._status(tid, types_pb2.TASK_STATE_STARTING, d.decision_id)
                self._pending_running[self._status(tid, RUNNING, d.decision_id)] = tid
                self._fleet.started += 1
                end = asyncio.create_task(self._end_later(tid))
                self._ends.add(end)
                end.add_done_callback(self._ends.discard)
            self._out.put_nowait(agent_pb2.AgentMessage(decision_ack=agent_pb2.DecisionAck(
                decision_id=d.decision_id, ok=True, task_id=tid)))
        elif which == "stop":
            tid = d.stop.task_id
            decision_id = self._running.pop(tid, None)
            if decision_id is not None:
                self._status(tid, types_pb2.TASK_STATE_FAILED, decision_id, exit_code=-15, reason="stopped")
            self._out.put_nowait(agent_pb2.AgentMessage(decision_ack=agent_pb2.DecisionAck(
                decision_id=d.decision_id, ok=decision_id is not None, task_id=tid,
                task_unknown=decision_id is None)))
        else:
            self._out.put_nowait(agent_pb2.AgentMessage(decision_ack=agent_pb2.DecisionAck(
                decision_id=d.decision_id, ok=True)))

    async def run(self, stop: asyncio.Event) -> None:
        """Keep one stream open (reconnecting after an error) until ``stop``."""
        while not stop.is_set():
            try:
                await self._session(stop)
            except (grpc.aio.AioRpcError, ConnectionError) as e:
                if not self._fleet.stream_errors:
                    print(f"{self.node_id}: stream error {e!r:.300}", flush=True)
                self._fleet.stream_errors += 1
                await asyncio.sleep(0.5)

    async def _session(self, stop: asyncio.Event) -> None:
        call = self._stub.Connect()
        await call.write(agent_pb2.AgentMessage(register=agent_pb2.Register(
            inventory=self._inventory(), boot_id=1,
            tasks=[agent_pb2.TaskStatus(task_id=t, state=RUNNING, decision_id=d) for t, d in self._running.items()],
            reads_decisions=True)))
        first = await call.read()
        if first is grpc.aio.EOF or first.WhichOneof("body") != "welcome":
            raise ConnectionError(f"{self.node_id}: no welcome ({first})")
        # Unacknowledged events are re-sent on a new stream, in order (an agent's at-least-once delivery).
        self._out = asyncio.Queue()
        self._out.put_nowait(self._sample())

        batched = first.welcome.accepts_reports

        async def writer() -> None:
            # As the agent's writer does: what is queued together goes as one Reports message (acks, then events).
            while True:
                msgs = [await self._out.get()]
                while not self._out.empty():
                    msgs.append(self._out.get_nowait())
                reports = [m for m in msgs if m.WhichOneof("body") in ("decision_ack", "task_status")]
                if batched and len(reports) > 1:
                    for m in (m for m in msgs if m.WhichOneof("body") not in ("decision_ack", "task_status")):
                        await call.write(m)
                        self._fleet.written += 1
                    for at in range(0, len(reports), MAX_REPORTS):
                        chunk = reports[at:at + MAX_REPORTS]
                        await call.write(agent_pb2.AgentMessage(reports=agent_pb2.Reports(
                            decision_acks=[m.decision_ack for m in chunk if m.HasField("decision_ack")],
                            statuses=[m.task_status for m in chunk if m.HasField("task_status")])))
                        self._fleet.written += 1
                else:
                    for m in msgs:
                        await call.write(m)
                        self._fleet.written += 1

        async def beat() -> None:
            while True:
                await asyncio.sleep(self._args.telemetry_interval)
                self._out.put_nowait(self._sample())

        tasks = [asyncio.create_task(writer()), asyncio.create_task(beat())]
        stopped = asyncio.create_task(stop.wait())
        try:
            while True:
                read = asyncio.create_task(call.read())
                done, _ = await asyncio.wait({read, stopped}, return_when=asyncio.FIRST_COMPLETED)
                if stopped in done:
                    read.cancel()
                    call.cancel()
                    return
                msg = read.result()
                if msg is grpc.aio.EOF:
                    raise ConnectionError(f"{self.node_id}: stream ended")
                which = msg.WhichOneof("body")
                self._fleet.read[which] = self._fleet.read.get(which, 0) + 1
                if which == "decision":
                    self._decide(msg.decision)
                elif which == "decisions":
                    for decision in msg.decisions.decisions:
                        self._decide(decision)
                elif which == "event_ack":
                    now = time.time()
                    for seq in [s for s in self._pending_running if s <= msg.event_ack.up_to_seq]:
                        self._fleet.running_at.setdefault(self._pending_running.pop(seq), now)
        finally:
            stopped.cancel()
            for t in tasks:
                t.cancel()


# ---- retained tasks --------------------------------------------------------------------------------------------------

def preload(endpoints: list[str], prefix: str, count: int) -> None:
    """Write ``count`` SUCCEEDED tasks (with a plausible history) under ``prefix`` before any coordinator starts."""
    from coordinator.sync.client import connect, op_put
    from coordinator.sync.keys import Keys

    keys = Keys(prefix)
    client = connect(endpoints)
    base = time.time() - 3600
    ops = []
    for i in range(count):
        t0 = base + i * 0.01
        task = types_pb2.Task(id=f"t-old{i:07d}", spec=task_spec(i, ARGS), state=types_pb2.TASK_STATE_SUCCEEDED,
                              submit_unix_s=t0, reason="", exit_code=0, queue="default")
        for k, st in enumerate((types_pb2.TASK_STATE_PENDING, types_pb2.TASK_STATE_SCHEDULED,
                                types_pb2.TASK_STATE_STARTING, RUNNING, types_pb2.TASK_STATE_SUCCEEDED)):
            task.history.add(state=st, time_unix_s=t0 + 0.01 * k + (1.0 if st == types_pb2.TASK_STATE_SUCCEEDED
                                                                    else 0.0))
        ops.append(op_put(keys.task(task.id), task.SerializeToString()))
        if len(ops) == 100:
            client.txn([], ops)
            ops = []
    if ops:
        client.txn([], ops)
    client.close()


# ---- gptrmctl --------------------------------------------------------------------------------------------------------

def child_env() -> dict[str, str]:
    """The environment of child processes: the code under test is the caller's ``PYTHONPATH`` (another checkout,
    for a before/after comparison), else this checkout."""
    return {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH") or str(REPO)}


def time_ctl(address: str, timeout_s: float, *extra: str) -> tuple[float, float, int]:
    """(seconds to the first output line, seconds to the end, output lines) of ``gptrmctl ... tasks``; it is
    stopped after ``timeout_s`` (the end then reads as the timeout)."""
    argv = [str(BIN / "gptrmctl"), "--coordinator", address, "--insecure", "--timeout", "60", *extra, "tasks"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=child_env())
    assert proc.stdout is not None
    timer = threading.Timer(timeout_s, proc.kill)
    timer.start()
    first = None
    lines = 0
    for _ in proc.stdout:
        if first is None:
            first = time.perf_counter() - t0
        lines += 1
    proc.wait()
    timer.cancel()
    total = time.perf_counter() - t0
    if proc.returncode:
        print(f"  gptrmctl {' '.join(extra)} tasks exited {proc.returncode} (stopped after {timeout_s:g}s?)")
    return first if first is not None else total, total, lines


# ---- the run ---------------------------------------------------------------------------------------------------------

def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load {one:.2f} {five:.2f} {fifteen:.2f}"


async def run(args: argparse.Namespace, tmp: Path) -> None:
    etcd = EtcdCluster(tmp / "etcd", size=args.etcd_members)
    procs: list[Proc] = []
    fleet = Fleet()
    stop = asyncio.Event()
    agents: list[asyncio.Task] = []
    try:
        etcd.start()
        prefix = f"/bench/throughput-{os.getpid()}/"
        if args.retain:
            t0 = time.perf_counter()
            await asyncio.to_thread(preload, etcd.endpoints, prefix, args.retain)
            print(f"retained: {args.retain} SUCCEEDED tasks written to etcd in {time.perf_counter() - t0:.1f}s",
                  flush=True)
        flags = ["--finished-retention-count", str(args.retain + 10 * int(args.rate * args.duration) + 10_000),
                 "--log-level", "warning", "--loop-priority", args.loop_priority, *args.coordinator_args.split()]
        listen = f"127.0.0.1:{free_port()}"
        leader = Proc(coordinator_argv(listen, etcd.endpoints, prefix, tmp / "c1", extra=flags, coordinator_id="c1",
                                       profile_out=Path(args.profile) if args.profile else None),
                      tmp / "c1.log").start()
        procs.append(leader)
        t0 = time.perf_counter()
        wait_leader(listen, 180.0, leader)
        print(f"leader up in {time.perf_counter() - t0:.1f}s", flush=True)
        if args.standby:
            procs.append(Proc(coordinator_argv(f"127.0.0.1:{free_port()}", etcd.endpoints, prefix, tmp / "c2",
                                               extra=flags, coordinator_id="c2"), tmp / "c2.log").start())

        channels = [grpc.aio.insecure_channel(listen, options=OWN_CONNECTION) for _ in range(max(1, args.agents // 8))]
        sims = [SimAgent(k, channels[k % len(channels)], fleet, args) for k in range(args.agents)]
        agents = [asyncio.create_task(a.run(stop)) for a in sims]
        admin_channel = grpc.aio.insecure_channel(listen)
        admin = admin_pb2_grpc.AdminStub(admin_channel)

        async def ready() -> int:
            nodes = (await admin.ListNodes(admin_pb2.ListNodesRequest(), timeout=10)).nodes
            return sum(1 for n in nodes if n.state == types_pb2.NODE_STATE_READY and n.has_latest)

        deadline = time.monotonic() + 60
        while await ready() < args.agents:
            if time.monotonic() > deadline:
                nodes = (await admin.ListNodes(admin_pb2.ListNodesRequest(), timeout=10)).nodes
                raise TimeoutError(f"{args.agents} agents not READY within 60s: "
                                   + "; ".join(f"{n.record.inventory.node_id} {n.state} {n.has_latest}" for n in nodes))
            await asyncio.sleep(0.5)
        print(f"cluster: {args.etcd_members}-member etcd, 1 coordinator{' + 1 standby' if args.standby else ''}, "
              f"{args.agents} "
              f"simulated agents x {GPUS} GPUs; {args.clients} clients; {os.cpu_count()} CPUs; {load()}", flush=True)

        # -- the load --
        out = tmp / "clients.json"
        start_at = time.time() + 2.0
        client_argv = [sys.executable, __file__, "--role", "clients", "--address", listen, "--rate", str(args.rate),
                       "--duration", str(args.duration), "--clients", str(args.clients), "--channels",
                       str(args.channels), "--start-at", str(start_at), "--out", str(out),
                       "--run-id", str(random.getrandbits(32)), "--gpus", str(args.gpus),
                       "--gpu-mem-gib", str(args.gpu_mem_gib), "--cpu-cores", str(args.cpu_cores)]
        client_proc = subprocess.Popen(client_argv, env=child_env())
        assert leader.proc is not None
        leader_ps = psutil.Process(leader.proc.pid)
        spy = None
        if args.pyspy:
            spy = subprocess.Popen(["py-spy", "record", "--nonblocking", "--gil", "--format", "raw", "-o", args.pyspy,
                                    "-d", str(int(min(30, args.duration))), "-p", str(leader.proc.pid)],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        cpu0 = leader_ps.cpu_times()
        host0 = psutil.cpu_times()
        sched0 = main_thread_sched(leader_ps.pid)
        etcd_ps = [psutil.Process(m.proc.pid) for m in etcd.members if m.proc is not None]
        others = {"etcd": etcd_ps, "fleet": [psutil.Process()]}
        others_cpu0 = {k: cpu_s(v) for k, v in others.items()}
        etcd0 = await asyncio.to_thread(etcd_counters, etcd.endpoints[0])
        ticks = []
        most_waiting = 0
        while client_proc.poll() is None:
            await asyncio.sleep(5.0)
            status = await admin.GetStatus(admin_pb2.GetStatusRequest(), timeout=10)
            waiting_now = next((e.count for e in status.tasks_by_state if e.key == "pending"), 0)
            most_waiting = max(most_waiting, waiting_now)
            ticks.append((time.time() - start_at, len(fleet.running_at), load()))
            print(f"  t={ticks[-1][0]:5.1f}s running-acked={ticks[-1][1]} pending={waiting_now} {ticks[-1][2]}",
                  flush=True)
        end_at = start_at + args.duration
        if spy is not None:
            spy.wait()
        cpu1 = leader_ps.cpu_times()
        host1 = psutil.cpu_times()
        sched1 = main_thread_sched(leader_ps.pid)
        others_cpu = {k: cpu_s(v) - others_cpu0[k] for k, v in others.items()}
        etcd1 = await asyncio.to_thread(etcd_counters, etcd.endpoints[0])
        doc = json.loads(out.read_text())
        others_cpu["callers"] = doc["cpu_s"]
        returned = {tid: t_ret for tid, _t0, t_ret in doc["returned"]}
        rpc = [t_ret - t0 for _tid, t0, t_ret in doc["returned"]]
        # Let what was accepted reach RUNNING (or time out), then end.
        drain_deadline = time.monotonic() + args.drain_timeout
        while time.monotonic() < drain_deadline and any(t not in fleet.running_at for t in returned):
            await asyncio.sleep(0.5)
        accepted_in_window = sum(1 for t in returned.values() if start_at <= t <= end_at)
        running_in_window = sum(1 for t in fleet.running_at.values() if start_at <= t <= end_at)
        latency = [fleet.running_at[t] - r for t, r in returned.items() if t in fleet.running_at]
        never = sum(1 for t in returned if t not in fleet.running_at)
        submits_s = accepted_in_window / args.duration
        running_s = running_in_window / args.duration
        p50, p99 = percentile(latency, 50), percentile(latency, 99)
        print(f"\nload: {args.rate:g}/s offered for {args.duration:g}s by {args.clients} clients; {load()}")
        print(f"  accepted {len(returned)} ({submits_s:.0f}/s in the window), refused {doc['errors'] or 'none'}")
        print(f"  SubmitTask RPC p50 {percentile(rpc, 50) * 1000:.0f} ms  p99 {percentile(rpc, 99) * 1000:.0f} ms")
        print(f"  RUNNING in the window {running_in_window} ({running_s:.0f}/s); never RUNNING {never}; "
              f"most PENDING at once {most_waiting}")
        print(f"  submit -> RUNNING p50 {p50:.3f}s  p99 {p99:.3f}s  max {max(latency, default=float('nan')):.3f}s")
        print(f"  leader CPU {100 * (cpu1.user + cpu1.system - cpu0.user - cpu0.system) / args.duration:.0f}% of "
              f"one core; fleet stream errors {fleet.stream_errors}")
        ran, waited = (sched1[0] - sched0[0]) / args.duration, (sched1[1] - sched0[1]) / args.duration
        print(f"  leader's event-loop thread ({loop_priority.current(leader_ps.pid).policy}): "
              f"ran {100 * ran:.0f}% of the time, ready but waiting for a CPU "
              f"{100 * waited:.0f}%")
        print("  other CPU: " + ", ".join(f"{k} {100 * v / args.duration:.0f}%" for k, v in others_cpu.items())
              + f" (all {len(etcd_ps)} etcd members together)")
        per_task = max(1, fleet.started)
        # Linux counts a guest's time in user (and nice) as well: left out of the sum once.
        host_all = sum(host1) - sum(host0) - (host1.guest + host1.guest_nice - host0.guest - host0.guest_nice)
        host_idle = host1.idle - host0.idle + host1.iowait - host0.iowait
        host_busy = host_all - host_idle
        per_accepted = 1e6 / max(1, accepted_in_window)
        leader_s = cpu1.user + cpu1.system - cpu0.user - cpu0.system
        print(f"  CPU per task accepted: leader {leader_s * per_accepted:.0f}"
              f" us (its event-loop thread {ran * args.duration * per_accepted:.0f} us), etcd "
              f"{others_cpu['etcd'] * per_accepted:.0f} us, the whole host {host_busy * per_accepted:.0f} us; "
              f"host idle {100 * host_idle / max(1e-9, host_all):.0f}%")
        print("  etcd per task started (one member's counters): "
              + ", ".join(f"{k} {(etcd1[k] - etcd0[k]) / per_task:.2f}" for k in ETCD_COUNTERS.values()))
        print(f"  agent stream messages per task started: {fleet.written / per_task:.2f} written, "
              f"{sum(fleet.read.values()) / per_task:.2f} read ("
              + ", ".join(f"{k} {v / per_task:.2f}" for k, v in sorted(fleet.read.items())) + ")")

        waiting = (await admin.ListTasks(admin_pb2.ListTasksRequest(states=[types_pb2.TASK_STATE_PENDING],
                                                                    page_size=1), timeout=60)).tasks
        if waiting:
            print(f"  a task still PENDING after the drain: {waiting[0].reason[:200]!r}")

        # -- retained tasks: memory and listing --
        done_deadline = time.monotonic() + args.drain_timeout
        while time.monotonic() < done_deadline and fleet.ended < fleet.started:
            await asyncio.sleep(0.5)
        counts = (await admin.GetStatus(admin_pb2.GetStatusRequest(), timeout=10))
        rss = leader_ps.memory_info().rss / 2**20
        print(f"\nretained: {args.retain} preloaded + {len(returned)} run; leader RSS {rss:.0f} MiB; "
              f"tasks {', '.join(f'{e.key}={e.count}' for e in counts.tasks_by_state)}")
        if args.ctl:
            for extra in ((), ("-o", "json")):
                first, total, lines = await asyncio.to_thread(time_ctl, listen, args.ctl_timeout, *extra)
                print(f"  gptrmctl {' '.join(extra) or '(table)'} tasks: first line {first:.2f}s, all {total:.2f}s "
                      f"({lines} lines); {load()}")
        await admin_channel.close()
        print(f"\nsustained: submits/s={submits_s:.0f} running/s={running_s:.0f} p99_submit_to_running_s={p99:.3f}")
    finally:
        stop.set()
        for a in agents:
            a.cancel()
        for p in reversed(procs):
            status = p.stop()
            if status not in (0, None, -15):
                print(f"{p.log_path.name} exited with {status}; tail:\n{p.tail(1500)}", file=sys.stderr)
        etcd.stop()


ETCD_COUNTERS = {"etcd_mvcc_txn": "txns", "etcd_mvcc_put": "puts", "etcd_mvcc_range": "ranges",
                 "etcd_server_proposals_committed": "proposals"}


def etcd_counters(endpoint: str) -> dict[str, float]:
    """One member's request counters (its ``/metrics``): transactions, puts, ranges and raft proposals."""
    with urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out = dict.fromkeys(ETCD_COUNTERS.values(), 0.0)
    for family in text_string_to_metric_families(text):
        if family.name in ETCD_COUNTERS:
            out[ETCD_COUNTERS[family.name]] += sum(s.value for s in family.samples if s.name.endswith("_total"))
    return out


def main_thread_sched(pid: int) -> tuple[float, float]:
    """(seconds run, seconds runnable but waiting for a CPU) of process ``pid``'s main thread so far
    (``/proc/PID/task/PID/schedstat``; zeros where the kernel keeps no such account)."""
    try:
        ran, waited, _slices = Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()
    except (OSError, ValueError):
        return 0.0, 0.0
    return int(ran) / 1e9, int(waited) / 1e9


def cpu_s(procs: list[psutil.Process]) -> float:
    """User and system CPU seconds of ``procs`` so far (0 for one that has ended)."""
    total = 0.0
    for proc in procs:
        try:
            t = proc.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


ARGS: argparse.Namespace


def main() -> None:
    global ARGS
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--role", choices=("bench", "clients"), default="bench")
    p.add_argument("--rate", type=float, default=500.0, help="submissions offered per second")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of load")
    p.add_argument("--clients", type=int, default=192, help="concurrent SubmitTask callers")
    p.add_argument("--channels", type=int, default=8, help="gRPC connections the callers share")
    p.add_argument("--agents", type=int, default=24, help="simulated agents (8 GPUs each)")
    p.add_argument("--task-seconds", type=float, default=1.0, help="each task runs this long, then succeeds")
    p.add_argument("--telemetry-interval", type=float, default=5.0, help="seconds between an agent's samples")
    p.add_argument("--gpus", type=float, default=0.125, help="GPUs per task (shared)")
    p.add_argument("--gpu-mem-gib", type=float, default=1.0, help="GPU memory per GPU, GiB")
    p.add_argument("--cpu-cores", type=float, default=0.1, help="host cores per task")
    p.add_argument("--retain", type=int, default=100_000, help="finished tasks in etcd before the coordinator starts")
    p.add_argument("--loop-priority", choices=("normal", "realtime"), default="realtime",
                   help="the leader's event-loop thread's CPU class; realtime, as the installed systemd unit sets it "
                        "(needs root or CAP_SYS_NICE here; refused, the leader runs normal and says so)")
    p.add_argument("--etcd-members", type=int, default=3,
                   help="etcd members (1 shows what etcd's replication costs the rest of the host)")
    p.add_argument("--standby", action="store_true", help="also start a standby coordinator")
    p.add_argument("--ctl", action=argparse.BooleanOptionalAction, default=True, help="time gptrmctl tasks at the end")
    p.add_argument("--ctl-timeout", type=float, default=120.0, help="seconds one gptrmctl tasks may take")
    p.add_argument("--pyspy", default="",
                   help="py-spy record the leader (the thread holding the GIL) during the load into this file (raw)")
    p.add_argument("--drain-timeout", type=float, default=60.0, help="seconds to wait for accepted tasks to run")
    p.add_argument("--coordinator-args", default="", help="extra coordinator flags, space-separated")
    p.add_argument("--profile", default="", help="run the leader under cProfile, writing this file")
    p.add_argument("--keep-dir", default="", help="keep state and logs here instead of a temporary directory")
    # --role clients only
    p.add_argument("--address", default="")
    p.add_argument("--start-at", type=float, default=0.0)
    p.add_argument("--out", default="")
    p.add_argument("--run-id", default="0")
    ARGS = args = p.parse_args()
    if args.role == "clients":
        asyncio.run(_clients(args))
        return
    with work_dir(args.keep_dir, "gptrm-bench-throughput-") as tmp:
        asyncio.run(run(args, tmp))


if __name__ == "__main__":
    main()
