"""Benchmark: telemetry ingest of one coordinator process from many simulated agents.

Run: ``.venv/bin/python tests/bench/bench_ingest.py [--steps 250,500,1000,2000,3000] [--window 20]``.

It starts a single-member embedded etcd and one ``gptrm-coordinator`` process on loopback,
then one or more load-generator processes (this file with ``--role generator``) that run
lightweight agent streams with ``grpc.aio``: each stream registers like a real agent (8
simulated H100 GPUs), waits for the Welcome, then sends one ``TelemetrySample`` (every GPU
field a simulated agent sends) per second (a real agent sends no separate heartbeat while its
telemetry flows; ``--heartbeats`` adds one per second anyway), the streams' start times
spread uniformly over the second. Several streams share one channel (HTTP/2 connection).
Messages are pre-serialized once per stream and only the sample time is patched in, so the
generator spends its CPU on gRPC, not on building protobufs.

The agent count is ramped (agents from earlier steps keep streaming). Per step, after a
warm-up, for ``--window`` seconds it measures:

- samples/s seen: growth of the coordinator's ``gptrm_telemetry_samples_total`` counter (two
  ``/metrics`` scrapes bracketing the window; the scrape time is printed, it grows with GPUs);
- ingest lag: for ``--lag-nodes`` random nodes a second, read ``GetNode`` (latest sample time
  ``T0``), wait until the node's next sample is due (``T0`` + 1 s), then poll ``GetNode`` until a
  newer sample shows: lag = (time the poll's answer arrived) - (the new sample's
  ``time_unix_s``), i.e. an upper bound that includes one Admin RPC. Polls back off to 5 % of
  the time waited so far (at least ``--poll-ms``); a sample not visible after ``--lag-timeout``
  counts as an infinite lag;
- CPU (% of one core) of the coordinator (all threads, and ``loop %``: its main thread, the asyncio
  loop, which saturates at 100 % whatever the cores), its RSS (also per node: RSS above the idle RSS
  read once the coordinator leads and before any agent connects, divided by the agents), the
  generators', etcd's, and
  ``other%``: what the rest of the host used meanwhile (on a shared machine a busy neighbour
  shows there, and is named in a note: the figures are then pessimistic);
- after the window, the time one full ``/metrics`` scrape takes (it renders every GPU's gauges).

A step passes when p99 lag < 1 s and samples/s seen >= 95 % of agents x 1 Hz. By default the
ramp stops after the first failing step (``--keep-going`` to continue). The per-node memory of
the largest step is compared with ``--max-kib-per-node`` (reported, not a pass condition).

Baseline, in the same run: the same generator and lag measurement against a bare
``grpc.aio`` server (``--role baseline-server``) that only keeps each node's latest sample and
answers ``GetNode`` from it, at ``--baseline-agents`` agents: the cost of the transport and the
measurement themselves on this machine, which the coordinator's figures include.

At the end it also times the coordinator's ``ResourceMonitor.ingest`` in-process (per 8-GPU
sample), and one recompute of the cluster objectives (done by the first reader after a
batch). ``--profile FILE`` runs the coordinator under cProfile (``python -m cProfile -o
FILE``; slower) and prints its top functions; ``--lag-trace FILE`` writes every lag sample
to a CSV file.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import re
import signal
import struct
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import grpc.aio
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_util import CpuMeter, Proc, coordinator_argv, free_port, percentile, wait_leader, work_dir

from common.pb.gptrm.v1 import admin_pb2, admin_pb2_grpc, agent_pb2, agent_pb2_grpc, types_pb2
from coordinator.etcd_embedded import EmbeddedEtcd

CONNECT_METHOD = "/gptrm.v1.AgentGateway/Connect"
GOLDEN = 0.6180339887498949
SENTINEL_T = 1234567.890625           # exactly representable; its 8 bytes mark where the time goes
GPUS = 8
GIB = 1 << 30
SAMPLES_METRIC = "gptrm_telemetry_samples_total"
PASS_P99_S = 1.0
PASS_RATE = 0.95


def node_id(k: int) -> str:
    return f"bench-{k:05d}"


def phase(k: int) -> float:
    """Offset of agent ``k``'s sends within the second (a low-discrepancy sequence: uniform for any prefix)."""
    return (k * GOLDEN) % 1.0


# ---- messages ------------------------------------------------------------------------------------------------------

def register_message(k: int) -> bytes:
    name = node_id(k)
    gpus = [types_pb2.GpuInfo(index=i, uuid=f"GPU-sim-{name}-{i}", model="H100-80GB", mem_total_bytes=80 * GIB,
                              power_limit_w=700) for i in range(GPUS)]
    inv = types_pb2.NodeInventory(node_id=name, hostname=name, gpus=gpus, cpu_cores=64, mem_total_bytes=512 * GIB,
                                  simulated=True, gpu_backend="simulated")
    return agent_pb2.AgentMessage(register=agent_pb2.Register(inventory=inv)).SerializeToString()


def telemetry_template(k: int, variant: int) -> tuple[bytes, bytes]:
    """(prefix, suffix) of a serialized telemetry AgentMessage; the sample time's 8 bytes go between them."""
    name = node_id(k)
    util = 0.3 + 0.1 * variant
    gpus = []
    for i in range(GPUS):
        power = 70.0 + 630.0 * util
        gpus.append(types_pb2.GpuSample(
            index=i, uuid=f"GPU-sim-{name}-{i}", util_gpu=util, util_mem=util / 2, mem_used_bytes=int(40 * GIB * util),
            mem_total_bytes=80 * GIB, power_w=power, power_limit_w=700.0, energy_j=1e6 + 1e3 * variant,
            temperature_c=30 + 50 * power / 700, sm_clock_mhz=int(210 + 1770 * util), mem_clock_mhz=2619,
            ecc_corrected_total=0, ecc_uncorrected_total=0, mig_enabled=False, healthy=True, simulated=True,
            processes=[types_pb2.GpuProcess(pid=1000 + i, used_mem_bytes=int(40 * GIB * util))]))
    host = types_pb2.HostSample(cpu_util=0.2, load1=4.0, load5=3.5, load15=3.0, mem_used_bytes=100 * GIB,
                                mem_total_bytes=512 * GIB, net_rx_bytes_total=10**12, net_tx_bytes_total=10**12,
                                disks=[types_pb2.DiskSample(path="/", total_bytes=2 << 40, used_bytes=1 << 40)])
    sample = types_pb2.TelemetrySample(time_unix_s=SENTINEL_T, gpus=gpus, host=host, simulated=True)
    raw = agent_pb2.AgentMessage(telemetry=agent_pb2.TelemetryBatch(samples=[sample])).SerializeToString()
    mark = struct.pack("<d", SENTINEL_T)
    at = raw.index(mark)
    assert raw.count(mark) == 1
    return raw[:at], raw[at + 8:]


def _raw(b: bytes) -> bytes:
    return b


# ---- load generator (--role generator) ----------------------------------------------------------------------------

class Generator:
    """Agent streams of one generator process; driven by JSON lines on stdin."""

    def __init__(self, target: str, per_channel: int, interval_s: float, heartbeats: bool) -> None:
        self.target = target
        self.per_channel = max(1, per_channel)
        self.interval_s = interval_s
        self.heartbeats = heartbeats
        self.channels: list[grpc.aio.Channel] = []
        self.agents = 0
        self.connected = 0
        self.sent = 0
        self.skipped = 0
        self.errors = 0
        self.late: list[float] = []
        self.tasks: set[asyncio.Task] = set()
        self._sem = asyncio.Semaphore(64)   # registrations in flight

    def _channel(self) -> grpc.aio.Channel:
        ci = self.agents // self.per_channel
        while len(self.channels) <= ci:
            # A local subchannel pool: each channel gets its own TCP connection.
            self.channels.append(grpc.aio.insecure_channel(self.target, options=[
                ("grpc.use_local_subchannel_pool", 1), ("grpc.max_receive_message_length", 16 << 20)]))
        self.agents += 1
        return self.channels[ci]

    async def add(self, indices: list[int], timeout_s: float) -> dict:
        """Start agents ``indices``; returns once all registered, or after ``timeout_s`` (the rest are dropped)."""
        started = time.monotonic()
        loop = asyncio.get_running_loop()
        pending: dict[asyncio.Future, asyncio.Task] = {}
        for k in indices:
            fut = loop.create_future()
            task = asyncio.create_task(self._agent(k, self._channel(), fut))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
            pending[fut] = task
        done, late = await asyncio.wait(pending, timeout=timeout_s) if pending else (set(), set())
        for fut in late:
            pending[fut].cancel()
        await asyncio.gather(*(pending[f] for f in late), return_exceptions=True)
        return {"connected": self.connected, "failed": len(late) + sum(1 for f in done if not f.result()),
                "seconds": time.monotonic() - started}

    async def _agent(self, k: int, channel: grpc.aio.Channel, ready: asyncio.Future) -> None:
        call = None
        phase_name = "register"
        try:
            async with self._sem:
                call = channel.stream_stream(CONNECT_METHOD, request_serializer=_raw,
                                             response_deserializer=agent_pb2.CoordinatorMessage.FromString)()
                await call.write(register_message(k))
                first = await call.read()
                if first is grpc.aio.EOF or not first.HasField("welcome"):
                    raise ConnectionError(f"no welcome: {first}")
            phase_name = "stream"
            self.connected += 1
            ready.set_result(True)
            templates = [telemetry_template(k, v) for v in range(2)]
            heartbeat = agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat(time_unix_s=time.time()))
            hb = heartbeat.SerializeToString()
            reader = asyncio.create_task(self._drain(call))
            now = time.time()
            due = math.floor(now) + phase(k) * self.interval_s
            while due < now:
                due += self.interval_s
            n = 0
            while not reader.done():
                delay = due - time.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                t = time.time()
                self.late.append(t - due)
                prefix, suffix = templates[n % 2]
                await call.write(prefix + struct.pack("<d", t) + suffix)
                self.sent += 1
                n += 1
                if self.heartbeats:
                    await call.write(hb)
                due += self.interval_s
                behind = time.time() - due
                if behind > 0:   # the generator could not keep up: skip the missed ticks (offered drops)
                    missed = math.floor(behind / self.interval_s) + 1
                    self.skipped += missed
                    due += missed * self.interval_s
        except (grpc.aio.AioRpcError, ConnectionError) as e:
            self.errors += 1
            print(f"agent {k} ({phase_name}): {e!r}"[:300], file=sys.stderr, flush=True)
        finally:
            if ready.done():
                self.connected -= 1
            else:
                ready.set_result(False)
            if call is not None:
                call.cancel()

    @staticmethod
    async def _drain(call: grpc.aio.StreamStreamCall) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.CancelledError):
            while (await call.read()) is not grpc.aio.EOF:
                pass

    def stats(self) -> dict:
        late, self.late = self.late, []
        return {"sent": self.sent, "skipped": self.skipped, "errors": self.errors, "connected": self.connected,
                "late_p50": percentile(late, 50), "late_p99": percentile(late, 99), "time": time.time()}

    async def close(self) -> None:
        for t in list(self.tasks):
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for ch in self.channels:
            await ch.close()


async def generator_main(args: argparse.Namespace, gen: Generator | None = None) -> None:
    """Serve JSON-line commands on stdin (add, stats, quit) with ``gen`` (default: a plain :class:`Generator`)."""
    if gen is None:
        gen = Generator(args.target, args.streams_per_channel, args.interval, args.heartbeats)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)

    def reply(obj: dict) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    try:
        while line := await reader.readline():
            cmd = json.loads(line)
            if cmd["cmd"] == "add":
                reply(await gen.add(cmd["indices"], cmd["timeout_s"]))
            elif cmd["cmd"] == "stats":
                reply(gen.stats())
            elif cmd["cmd"] == "trace" and hasattr(gen, "trace"):
                reply(gen.trace(cmd["since"], cmd["slowest"]))
            elif cmd["cmd"] == "quit":
                break
    finally:
        await gen.close()


# ---- baseline server (--role baseline-server) ---------------------------------------------------------------------

async def baseline_main(args: argparse.Namespace) -> None:
    """A bare grpc.aio server: keeps each node's latest sample, answers GetNode from it."""
    from prometheus_client import CollectorRegistry, Counter, start_http_server

    registry = CollectorRegistry()
    samples = Counter(SAMPLES_METRIC, "telemetry samples received", registry=registry)
    latest: dict[str, types_pb2.TelemetrySample] = {}

    class Gateway(agent_pb2_grpc.AgentGatewayServicer):
        async def Connect(self, request_iterator, context):
            first = await anext(request_iterator)
            node = first.register.inventory.node_id
            yield agent_pb2.CoordinatorMessage(welcome=agent_pb2.Welcome(node_id=node, sampling_interval_s=1.0,
                                                                         heartbeat_interval_s=1.0))
            async for msg in request_iterator:
                if msg.WhichOneof("body") == "telemetry" and msg.telemetry.samples:
                    latest[node] = msg.telemetry.samples[-1]
                    samples.inc(len(msg.telemetry.samples))

    class Admin(admin_pb2_grpc.AdminServicer):
        async def GetNode(self, request, context):
            view = admin_pb2.NodeView()
            s = latest.get(request.node_id)
            if s is not None:
                view.latest.CopyFrom(s)
                view.has_latest = True
            return view

        async def GetStatus(self, request, context):
            return admin_pb2.ClusterStatus(is_leader=True, coordinator_id="baseline")

    server = grpc.aio.server(options=[("grpc.so_reuseport", 0), ("grpc.max_receive_message_length", 16 << 20)])
    agent_pb2_grpc.add_AgentGatewayServicer_to_server(Gateway(), server)
    admin_pb2_grpc.add_AdminServicer_to_server(Admin(), server)
    server.add_insecure_port(args.listen)
    host, _, port = args.metrics_listen.rpartition(":")
    start_http_server(int(port), addr=host, registry=registry)
    await server.start()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(grace=0.5)


# ---- orchestrator -------------------------------------------------------------------------------------------------

@dataclass
class Row:
    label: str
    agents: int
    offered: float = 0.0
    seen: float = 0.0
    lags: list[float] = field(default_factory=list)
    misses: int = 0
    polls: int = 0
    rtts: list[float] = field(default_factory=list)
    cpu: float = 0.0
    loop_cpu: float = 0.0
    rss: float = 0.0
    idle_rss: float = 0.0
    gen_cpu: float = 0.0
    me_cpu: float = 0.0
    etcd_cpu: float = 0.0
    host_cpu: float = 0.0
    late_p99: float = 0.0
    skipped: int = 0
    errors: int = 0
    neighbours: str = ""
    irq_cpu: float = 0.0
    connect_s: float = 0.0
    connect_failed: int = 0
    scrape_s: float = 0.0
    trace: list[tuple[float, str, float]] = field(default_factory=list)

    @property
    def other_cpu(self) -> float:
        """CPU the rest of the host used meanwhile (other processes, kernel): a noisy neighbour shows here."""
        return max(0.0, self.host_cpu - self.cpu - self.gen_cpu - self.me_cpu - self.etcd_cpu)

    @property
    def kib_per_node(self) -> float:
        """The server's RSS above its idle RSS (before any agent), per agent, KiB."""
        return (self.rss - self.idle_rss) * 1024 / self.agents if self.agents and self.idle_rss else math.nan

    @property
    def p50(self) -> float:
        return percentile(self.lags, 50)

    @property
    def p99(self) -> float:
        return percentile(self.lags, 99)

    @property
    def passed(self) -> bool:
        return (bool(self.lags) and self.p99 < PASS_P99_S and self.seen >= PASS_RATE * self.agents
                and self.connect_failed <= 0.01 * self.agents)


class HostMeter:
    """CPU of every other process on the host over a window, to name a noisy neighbour."""

    def __init__(self) -> None:
        self._t0 = 0.0
        self._cpu0: dict[int, tuple[str, float]] = {}
        self._sys0: object = None

    @staticmethod
    def _snapshot() -> dict[int, tuple[str, float]]:
        out = {}
        for p in psutil.process_iter(["name", "cmdline", "cpu_times"]):
            t = p.info["cpu_times"]
            if t is not None:
                cmd = " ".join(p.info["cmdline"] or [p.info["name"] or "?"])
                out[p.pid] = (cmd, t.user + t.system)
        return out

    def start(self) -> None:
        self._t0, self._cpu0, self._sys0 = time.monotonic(), self._snapshot(), psutil.cpu_times()

    def top(self, ours: set[int], n: int = 2) -> tuple[str, float]:
        """(the busiest other processes, kernel softirq+irq CPU %) since start."""
        wall = time.monotonic() - self._t0
        rows = []
        for pid, (cmd, cpu) in self._snapshot().items():
            if pid in ours or pid not in self._cpu0:
                continue
            pct = 100.0 * (cpu - self._cpu0[pid][1]) / wall
            if pct >= 5.0:
                rows.append((pct, cmd))
        rows.sort(reverse=True)
        sys1, sys0 = psutil.cpu_times(), self._sys0
        irq = sum(getattr(sys1, f, 0.0) - getattr(sys0, f, 0.0) for f in ("irq", "softirq"))
        text = ", ".join(f"{pct:.0f}% {cmd[:70]}" for pct, cmd in rows[:n])
        return text, 100.0 * irq / wall


class GenProc:
    """A generator child process and its JSON-line pipe."""

    def __init__(self, proc: asyncio.subprocess.Process, log: Path) -> None:
        self.proc = proc
        self.log = log

    async def ask(self, obj: dict, timeout_s: float = 300.0) -> dict:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write((json.dumps(obj) + "\n").encode())
        await self.proc.stdin.drain()
        line = await asyncio.wait_for(self.proc.stdout.readline(), timeout=timeout_s)
        if not line:
            raise RuntimeError(f"generator exited; its log:\n{self.log.read_text(errors='replace')[-2000:]}")
        return json.loads(line)

    async def stop(self) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(Exception):
                self.proc.stdin.write(b'{"cmd": "quit"}\n')  # type: ignore[union-attr]
                await asyncio.wait_for(self.proc.wait(), timeout=10)
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()


async def start_generators(args: argparse.Namespace, target: str, tmp: Path, tag: str,
                           script: Path | None = None, extra: tuple[str, ...] = ()) -> list[GenProc]:
    """Start ``args.generators`` generator processes (``script --role generator``, default this file)."""
    gens = []
    for g in range(args.generators):
        log = tmp / f"generator-{tag}-{g}.log"
        with log.open("ab") as err:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, str(script or Path(__file__).resolve()), "--role", "generator", "--target", target,
                "--streams-per-channel", str(args.streams_per_channel), "--interval", str(args.interval),
                *(["--heartbeats"] if args.heartbeats else []), *extra,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=err)
        gens.append(GenProc(proc, log))
    return gens


def scrape_samples(metrics_address: str, full: bool = False) -> tuple[float, float, float]:
    """(samples counter, time the answer arrived, seconds the scrape took).

    Without ``full`` only the counter is asked for (``name[]=``), which spares rendering the per-GPU gauges.
    """
    query = "" if full else f"?name[]={SAMPLES_METRIC.removesuffix('_total')}&name[]={SAMPLES_METRIC}"
    t0 = time.time()
    with urllib.request.urlopen(f"http://{metrics_address}/metrics{query}", timeout=120) as r:
        body = r.read().decode()
    t1 = time.time()
    m = re.search(rf"^{SAMPLES_METRIC} ([0-9.e+]+)$", body, re.M)
    if m is None:
        raise RuntimeError(f"{SAMPLES_METRIC} not in the /metrics answer")
    return float(m.group(1)), t1, t1 - t0


class LagProbe:
    """Measures sample time → visible in ``GetNode`` for random nodes."""

    def __init__(self, address: str, args: argparse.Namespace) -> None:
        self.channel = grpc.aio.insecure_channel(address)
        self.stub = admin_pb2_grpc.AdminStub(self.channel)
        self.args = args

    async def _one(self, node: str, delay: float, row: Row, busy: set[str]) -> None:
        a = self.args
        try:
            await asyncio.sleep(delay)
            t_req = time.time()
            view = await self.stub.GetNode(admin_pb2.GetNodeRequest(node_id=node), timeout=10)
            row.rtts.append(time.time() - t_req)
            if not view.has_latest:
                return
            t0 = view.latest.time_unix_s
            due = t0 + a.interval
            await asyncio.sleep(max(0.0, due - time.time()))
            while True:
                view = await self.stub.GetNode(admin_pb2.GetNodeRequest(node_id=node), timeout=10)
                t_resp = time.time()
                row.polls += 1
                if view.latest.time_unix_s > t0:
                    row.lags.append(t_resp - view.latest.time_unix_s)
                    row.trace.append((view.latest.time_unix_s, node, t_resp - view.latest.time_unix_s))
                    return
                waited = t_resp - due
                if waited > a.lag_timeout:
                    row.misses += 1
                    row.lags.append(math.inf)
                    return
                await asyncio.sleep(max(a.poll_ms / 1000.0, 0.05 * waited))
        except grpc.aio.AioRpcError:
            row.misses += 1
            row.lags.append(math.inf)
        finally:
            busy.discard(node)

    async def run(self, nodes: list[str], seconds: float, row: Row) -> None:
        per_s = self.args.lag_nodes
        busy: set[str] = set()
        tasks = []
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            tick = time.monotonic()
            for i in range(per_s):
                free = [n for n in random.sample(nodes, min(len(nodes), per_s * 2)) if n not in busy]
                if not free:
                    break
                busy.add(free[0])
                tasks.append(asyncio.create_task(self._one(free[0], i / per_s, row, busy)))
            await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
        await asyncio.gather(*tasks)

    async def close(self) -> None:
        await self.channel.close()


async def run_ramp(args: argparse.Namespace, label: str, address: str, metrics_address: str, server_pid: int,
                   steps: list[int], tmp: Path, tag: str, etcd_pid: int | None = None) -> list[Row]:
    """Ramp agents against the server at ``address``; one Row per step."""
    gens = await start_generators(args, address, tmp, tag)
    probe = LagProbe(address, args)
    rows: list[Row] = []
    server = CpuMeter(server_pid)
    gen_meters = [CpuMeter(g.proc.pid) for g in gens]
    me = CpuMeter(os.getpid())
    etcd = CpuMeter(etcd_pid) if etcd_pid else None
    host = HostMeter()
    ours = {os.getpid(), server_pid, *(g.proc.pid for g in gens), *([etcd_pid] if etcd_pid else [])}
    have = 0
    idle_rss = psutil.Process(server_pid).memory_info().rss / 2**20   # before any agent: the per-node baseline
    print(f"  [{label}] idle RSS {idle_rss:.0f} MB", flush=True)
    try:
        for count in steps:
            row = Row(label, count, idle_rss=idle_rss)
            new = list(range(have, count))
            t0 = time.monotonic()
            answers = await asyncio.gather(*(
                g.ask({"cmd": "add", "indices": new[i::len(gens)], "timeout_s": args.connect_timeout},
                      timeout_s=args.connect_timeout + 60) for i, g in enumerate(gens)))
            row.connect_s = time.monotonic() - t0
            row.connect_failed = sum(a["failed"] for a in answers)
            have = count
            print(f"  [{label}] {len(new) - row.connect_failed} of {len(new)} new agents registered in "
                  f"{row.connect_s:.1f}s ({(len(new) - row.connect_failed) / row.connect_s:.0f}/s)", flush=True)
            if row.connect_failed > 0.01 * count and not args.keep_going:
                rows.append(row)
                print(f"  [{label}] {row.connect_failed} agents not registered within {args.connect_timeout:g}s: "
                      "step failed, not measured", flush=True)
                break
            await asyncio.sleep(args.warmup / 2)
            c0, t_a, _ = await asyncio.to_thread(scrape_samples, metrics_address)
            await asyncio.sleep(args.warmup / 2)
            before = [await g.ask({"cmd": "stats"}) for g in gens]
            for m in (server, me, *gen_meters, *([etcd] if etcd else [])):
                m.start()
            psutil.cpu_percent()
            host.start()
            await probe.run([node_id(k) for k in range(count)], args.window, row)
            row.host_cpu = psutil.cpu_percent() * (os.cpu_count() or 1)
            row.neighbours, row.irq_cpu = host.top(ours)
            row.cpu, row.rss = server.read()
            row.loop_cpu = server.main_pct
            row.etcd_cpu = etcd.read()[0] if etcd else 0.0
            row.me_cpu = me.read()[0]
            row.gen_cpu = sum(m.read()[0] for m in gen_meters)
            after = [await g.ask({"cmd": "stats"}) for g in gens]
            c1, t_b, _ = await asyncio.to_thread(scrape_samples, metrics_address)
            row.seen = (c1 - c0) / (t_b - t_a)
            sent = sum(a["sent"] - b["sent"] for a, b in zip(after, before, strict=True))
            row.offered = sent / (max(a["time"] for a in after) - min(b["time"] for b in before))
            if args.full_scrape:   # after the window: what one Prometheus scrape costs at this size
                row.scrape_s = (await asyncio.to_thread(scrape_samples, metrics_address, True))[2]
            row.skipped = sum(a["skipped"] - b["skipped"] for a, b in zip(after, before, strict=True))
            row.errors = sum(a["errors"] for a in after)
            row.late_p99 = max(a["late_p99"] for a in after)
            rows.append(row)
            print("  " + format_row(row), flush=True)
            if not row.passed and not args.keep_going:
                break
    finally:
        await probe.close()
        for g in gens:
            await g.stop()
    return rows


HEADER = (f"{'server':<12}{'agents':>7}{'gpus':>7}{'offered/s':>10}{'seen/s':>9}{'p50 lag':>9}{'p99 lag':>9}"
          f"{'max lag':>9}{'cpu %':>7}{'loop %':>7}{'rss MB':>8}{'idle MB':>8}{'KiB/node':>9}"
          f"{'gen cpu%':>9}{'etcd%':>6}{'other%':>7}{'gen late99':>11}{'getnode50':>10}{'scrape s':>9}{'result':>7}")


def _ms(x: float) -> str:
    return "inf" if math.isinf(x) else ("-" if math.isnan(x) else f"{x * 1000:.0f}ms")


def format_row(r: Row) -> str:
    return (f"{r.label:<12}{r.agents:>7}{r.agents * GPUS:>7}{r.offered:>10.0f}{r.seen:>9.0f}{_ms(r.p50):>9}"
            f"{_ms(r.p99):>9}{_ms(max(r.lags) if r.lags else math.nan):>9}{r.cpu:>7.0f}{r.loop_cpu:>7.0f}"
            f"{r.rss:>8.0f}{r.idle_rss:>8.0f}{r.kib_per_node:>9.0f}{r.gen_cpu:>9.0f}{r.etcd_cpu:>6.0f}{r.other_cpu:>7.0f}{_ms(r.late_p99):>11}"
            f"{_ms(percentile(r.rtts, 50)):>10}{r.scrape_s:>9.2f}{'pass' if r.passed else 'FAIL':>7}")


def time_monitor_ingest(nodes: int, rounds: int = 3) -> tuple[float, float]:
    """In-process cost of the coordinator's ``ResourceMonitor.ingest`` for one 8-GPU sample, with ``nodes``
    nodes reporting; returns (µs per sample, µs of one recompute of the objectives, which readers trigger)."""
    from coordinator.monitor.resources import ResourceMonitor

    monitor = ResourceMonitor(900.0, 1.0)
    now = time.time()
    msgs = []
    for k in range(nodes):
        prefix, suffix = telemetry_template(k, k % 2)
        msgs.append((node_id(k), agent_pb2.AgentMessage.FromString(prefix + struct.pack("<d", now) + suffix)))
    for name, msg in msgs:   # first sample of a node allocates its ring buffers: not timed
        monitor.ingest(name, GPUS, msg.telemetry.samples)
    best = math.inf
    for _ in range(rounds):
        t0 = time.perf_counter()
        for name, msg in msgs:
            monitor.ingest(name, GPUS, msg.telemetry.samples)
        best = min(best, (time.perf_counter() - t0) / nodes)
    t0 = time.perf_counter()
    for _ in range(1000):
        monitor._recompute()
    rec = (time.perf_counter() - t0) / 1000
    return best * 1e6, rec * 1e6


def print_profile(path: Path, top: int) -> None:
    import pstats

    print(f"\ncoordinator cProfile ({path}), top {top} by own time:")
    stats = pstats.Stats(str(path))
    stats.sort_stats("tottime").print_stats(top)
    print(f"top {top} by cumulative time:")
    stats.sort_stats("cumulative").print_stats(top)


async def orchestrate(args: argparse.Namespace, tmp: Path) -> None:
    steps = [int(s) for s in args.steps.split(",") if s]
    rows: list[Row] = []
    print(f"telemetry ingest: {GPUS} GPUs/agent, 1 sample + {'1' if args.heartbeats else '0'} heartbeat per agent "
          f"per {args.interval:g}s, {args.generators} generator process(es), {args.streams_per_channel} "
          f"streams/channel, {os.cpu_count()} CPUs; lag probe {args.lag_nodes} nodes/s, window {args.window:g}s",
          flush=True)
    if args.baseline_agents > 0:
        listen, metrics = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        base = Proc([sys.executable, str(Path(__file__).resolve()), "--role", "baseline-server", "--listen", listen,
                     "--metrics-listen", metrics], tmp / "baseline.log").start()
        try:
            await asyncio.to_thread(wait_leader, listen, 30.0, base)
            rows += await run_ramp(args, "baseline", listen, metrics, base.pid, [args.baseline_agents], tmp, "base")
        finally:
            base.stop()
    etcd = EmbeddedEtcd(tmp / "etcd")
    coord: Proc | None = None
    profile_out = Path(args.profile).resolve() if args.profile else None
    try:
        await asyncio.to_thread(etcd.start)
        listen, metrics = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        prefix = f"/bench/ingest-{os.getpid()}-{int(time.time())}/"
        coord = Proc(coordinator_argv(listen, etcd.endpoints, prefix, tmp / "coordinator", metrics_listen=metrics,
                                      profile_out=profile_out, extra=args.coordinator_args.split()),
                     tmp / "coordinator.log").start()
        try:
            await asyncio.to_thread(wait_leader, listen, 60.0, coord)
        except RuntimeError:
            print(coord.tail(), file=sys.stderr)
            raise
        rows += await run_ramp(args, "coordinator", listen, metrics, coord.pid, steps, tmp, "coord",
                               etcd_pid=etcd.members[0].proc.pid)
    finally:
        if coord is not None:
            status = coord.stop(timeout_s=60)
            if status not in (0, None):
                print(f"coordinator exited with {status}; log tail:\n{coord.tail()}", file=sys.stderr)
        await asyncio.to_thread(etcd.stop)
    print("\nresults (lag = sample time → first GetNode answer showing it; cpu % of one core; "
          f"pass = p99 < {PASS_P99_S:g}s and seen ≥ {PASS_RATE:.0%} of agents × 1 Hz)")
    print(HEADER)
    for r in rows:
        print(format_row(r))
    for r in rows:
        extra = []
        if r.misses:
            extra.append(f"{r.misses} probes saw no new sample within {args.lag_timeout:g}s")
        if r.skipped:
            extra.append(f"generator skipped {r.skipped} late ticks")
        if r.connect_failed:
            extra.append(f"{r.connect_failed} new agents not registered within {args.connect_timeout:g}s")
        if r.errors:
            extra.append(f"{r.errors} streams failed (see the generator log)")
        if r.other_cpu >= 20:
            extra.append(f"the rest of the host used {r.other_cpu:.0f}% CPU (kernel irq/softirq {r.irq_cpu:.0f}%"
                         + (f"; busiest other processes: {r.neighbours}" if r.neighbours else "")
                         + "): figures are pessimistic")
        if extra:
            print(f"  note {r.label} {r.agents}: " + "; ".join(extra))
    coord_rows = [r for r in rows if r.label == "coordinator"]
    best = max((r.agents for r in coord_rows if r.passed), default=0)
    print(f"largest passing agent count: {best} ({best * GPUS} GPUs); target 2000 agents × 8 GPUs: "
          f"{'met' if best >= 2000 else 'NOT met'}")
    big = max((r for r in coord_rows if r.rss), key=lambda r: r.agents, default=None)   # measured steps
    if big is not None and not math.isnan(big.kib_per_node):
        print(f"coordinator memory at {big.agents} agents: RSS {big.rss:.0f} MB, idle {big.idle_rss:.0f} MB: "
              f"{big.kib_per_node:.0f} KiB per node above idle; target ≤ {args.max_kib_per_node:g} KiB: "
              f"{'met' if big.kib_per_node <= args.max_kib_per_node else 'NOT met'}")
    print(f"probe: {sum(r.polls for r in rows)} GetNode polls, {sum(len(r.lags) for r in rows)} lag samples; "
          f"probe process cpu {max((r.me_cpu for r in rows), default=0):.0f}% max")
    if args.micro:
        for n in sorted({min(steps or [2000]), 2000, max(steps or [2000])}):
            us, rec = await asyncio.to_thread(time_monitor_ingest, n)
            print(f"in-process ResourceMonitor.ingest at {n} nodes: {us:.0f} µs per 8-GPU sample = "
                  f"{us * n / 1e4:.0f}% of one core at {n} samples/s; one recompute of the cluster objectives "
                  f"(by the first reader after a batch) {rec:.0f} µs")
    if args.lag_trace:
        with open(args.lag_trace, "w") as fh:
            fh.write("server,agents,sample_time_unix_s,node,lag_s\n")
            for r in rows:
                fh.writelines(f"{r.label},{r.agents},{t:.6f},{n},{lag:.6f}\n" for t, n, lag in sorted(r.trace))
        print(f"lag samples written to {args.lag_trace}")
    if profile_out is not None and profile_out.exists():
        print_profile(profile_out, args.profile_top)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", default="250,500,1000,2000,3000", help="agent counts of the ramp")
    p.add_argument("--window", type=float, default=20.0, help="measurement window per step, seconds")
    p.add_argument("--warmup", type=float, default=4.0, help="seconds after the step's agents connected")
    p.add_argument("--connect-timeout", type=float, default=45.0,
                   help="seconds a step's new agents get to register; later ones are dropped and the step fails")
    p.add_argument("--interval", type=float, default=1.0, help="sampling interval of every agent, seconds")
    p.add_argument("--generators", type=int, default=1, help="load-generator processes")
    p.add_argument("--streams-per-channel", type=int, default=20, help="agent streams per gRPC channel")
    p.add_argument("--heartbeats", action="store_true",
                   help="also send one heartbeat per agent per second (agents skip it while telemetry flows)")
    p.add_argument("--lag-nodes", type=int, default=50, help="nodes probed for lag per second")
    p.add_argument("--poll-ms", type=float, default=10.0, help="shortest interval between GetNode polls")
    p.add_argument("--lag-timeout", type=float, default=5.0, help="seconds a probe waits for a new sample")
    p.add_argument("--baseline-agents", type=int, default=2000, help="agents against the bare server (0: skip)")
    p.add_argument("--no-full-scrape", dest="full_scrape", action="store_false",
                   help="skip timing one full /metrics scrape after each step")
    p.add_argument("--no-micro", dest="micro", action="store_false",
                   help="skip timing the coordinator's ResourceMonitor.ingest in-process")
    p.add_argument("--max-kib-per-node", type=float, default=100.0,
                   help="target coordinator RSS above its idle RSS per node, KiB (reported, not a pass condition)")
    p.add_argument("--keep-going", action="store_true", help="run every step even after one fails")
    p.add_argument("--coordinator-args", default="", help="extra coordinator flags, space-separated")
    p.add_argument("--keep-dir", default="", help="keep state and logs in this directory instead of a temporary one")
    p.add_argument("--lag-trace", default="", help="write every lag sample (time, node, lag) to this CSV file")
    p.add_argument("--profile", default="", help="run the coordinator under cProfile, stats to this file")
    p.add_argument("--profile-top", type=int, default=25)
    p.add_argument("--role", choices=("orchestrator", "generator", "baseline-server"), default="orchestrator",
                   help=argparse.SUPPRESS)
    p.add_argument("--target", help=argparse.SUPPRESS)
    p.add_argument("--listen", help=argparse.SUPPRESS)
    p.add_argument("--metrics-listen", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.role == "generator":
        asyncio.run(generator_main(args))
    elif args.role == "baseline-server":
        asyncio.run(baseline_main(args))
    else:
        with work_dir(args.keep_dir, "gptrm-bench-ingest-") as tmp:
            asyncio.run(orchestrate(args, tmp))


if __name__ == "__main__":
    main()
