"""Benchmark: one coordinator, many simulated agents, the telemetry rate adapting to the node count.

Run: ``.venv/bin/python tests/bench/bench_telemetry_rate.py [--agents 30000] [--baseline-agents 3000]``.

It starts a single-member embedded etcd and one ``gptrm-coordinator`` (``--ingest-budget``, default the
coordinator's own default) and ``--generators`` load-generator processes (this file with ``--role
generator``; the agent streams of ``bench_ingest.py``: 8 simulated H100 GPUs, pre-serialized messages).
Each simulated agent here behaves like ``gptrm-agent`` towards the telemetry rate: it reads the report
interval from its Welcome and from every ``TelemetryRate`` push, sends one summary per interval (a full
8-GPU sample with the summary fields set), the first one after a change at a random point of the
interval, and no separate heartbeat. With ``--fixed`` (the baseline) they ignore the rate, as an agent
older than it does, and the coordinator runs with a budget so high that it never asks for a longer
interval: everything at 1 Hz, as before.

Per run, after every agent registered and ``--settle`` seconds passed, it measures over ``--window``
seconds: the coordinator's CPU (% of one core) and RSS, the ingest rate (the coordinator's
``gptrm_telemetry_samples_total``), the interval in force (``GetStatus``), and then whether every
node was fresh: each node's latest sample (``ListNodes``) no older than ``--fresh`` seconds (15), and
the nodes by state (all READY is the pass). Figures are printed beside the baseline of the same run:
the same agents at a fixed 1 Hz, for ``--baseline-agents`` (as many as one coordinator carries at 1 Hz
on the machine; 0 skips it). ``other%`` is what the rest of the host used meanwhile: on a shared machine
a busy neighbour shows there and the figures are pessimistic.

The simulated agents reconnect 1-5 s after their stream ends (counted as ``reconn``). The coordinator runs
with ``--lease-ttl 10`` (default 2): on the shared 2-core machine a registration storm of 30,000 agents
stalls etcd and the coordinator's loop for seconds, and with 2 s the leader lost its lease, dropping every
stream. The coordinator keeps ``--history`` seconds of telemetry per node (default 60 here: its ring buffers
are sized per node from the sampling interval, 0.4 MB a node at the default 900 s, which alone would
not fit 30,000 nodes in this machine's memory).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import random
import struct
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
import grpc.aio
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_util import CpuMeter, Proc, coordinator_argv, free_port, wait_leader, work_dir
from bench_ingest import (
    CONNECT_METHOD,
    SENTINEL_T,
    Generator,
    _raw,
    generator_main,
    phase,
    register_message,
    scrape_samples,
    start_generators,
    telemetry_template,
)

from common.pb.gptrm.v1 import admin_pb2, admin_pb2_grpc, agent_pb2
from coordinator.etcd_embedded import EmbeddedEtcd

GPUS = 8


def summary_template(k: int, variant: int, every_s: float) -> tuple[bytes, bytes]:
    """(prefix, suffix) of a serialized telemetry message; a summary of ``every_s`` seconds when above 1 s."""
    prefix, suffix = telemetry_template(k, variant)
    if every_s <= 1.0:
        return prefix, suffix
    msg = agent_pb2.AgentMessage.FromString(prefix + struct.pack("<d", SENTINEL_T) + suffix)
    s = msg.telemetry.samples[0]
    s.summarised_samples, s.summary_of_s = round(every_s), every_s
    for g in s.gpus:
        g.util_gpu_max, g.power_w_max = min(1.0, g.util_gpu + 0.1), g.power_w + 50
        g.temperature_c_max, g.mem_used_bytes_max = g.temperature_c + 2, g.mem_used_bytes
    s.host.cpu_util_max, s.host.mem_used_bytes_max = min(1.0, s.host.cpu_util + 0.1), s.host.mem_used_bytes
    raw = msg.SerializeToString()
    mark = struct.pack("<d", SENTINEL_T)
    at = raw.index(mark)
    return raw[:at], raw[at + 8:]


class RateGenerator(Generator):
    """Agent streams that follow the coordinator's report interval (or ignore it with ``fixed``)."""

    def __init__(self, target: str, per_channel: int, fixed: bool) -> None:
        super().__init__(target, per_channel, 1.0, heartbeats=False)
        self.fixed = fixed
        self.rate_changes = 0
        self.reconnects = 0

    async def _agent(self, k: int, channel: grpc.aio.Channel, ready: asyncio.Future) -> None:
        """Register, stream, and (like an agent) reconnect after 1-5 s when the stream ends."""
        rng = random.Random(k)
        while True:
            try:
                await self._session(k, channel, ready, rng)
            except (grpc.aio.AioRpcError, ConnectionError, asyncio.InvalidStateError) as e:
                self.errors += 1
                if self.errors <= 20:
                    print(f"agent {k}: {e!r}"[:300], file=sys.stderr, flush=True)
            if not ready.done():
                ready.set_result(False)
                return
            self.reconnects += 1
            await asyncio.sleep(rng.uniform(1.0, 5.0))

    async def _session(self, k: int, channel: grpc.aio.Channel, ready: asyncio.Future, rng: random.Random) -> None:
        call = None
        streaming = False
        try:
            async with self._sem:
                call = channel.stream_stream(CONNECT_METHOD, request_serializer=_raw,
                                             response_deserializer=agent_pb2.CoordinatorMessage.FromString)()
                await call.write(register_message(k))
                first = await call.read()
                if first is grpc.aio.EOF or not first.HasField("welcome"):
                    raise ConnectionError(f"no welcome: {first}")
            self.connected += 1
            streaming = True
            if not ready.done():
                ready.set_result(True)
            every = [1.0 if self.fixed else max(1.0, first.welcome.report_interval_s)]
            changed = [False]
            reader = asyncio.create_task(self._listen(call, every, changed))
            now = time.time()
            due = now + (phase(k) if every[0] <= 1.0 else rng.uniform(0, every[0]))
            n = 0
            templates = {(v, every[0]): summary_template(k, v, every[0]) for v in range(2)}
            while not reader.done():
                delay = due - time.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                    if reader.done():
                        break
                t = time.time()
                key = (n % 2, every[0])
                if key not in templates:   # a new interval: the summaries of this agent for it (two variants)
                    templates = {(v, every[0]): summary_template(k, v, every[0]) for v in range(2)}
                prefix, suffix = templates[key]
                await call.write(prefix + struct.pack("<d", t) + suffix)
                self.sent += 1
                n += 1
                if changed[0]:   # like the agent: the first window after a change is of random length
                    changed[0] = False
                    due = t + rng.uniform(1.0, every[0]) if every[0] > 1.0 else t + 1.0
                else:
                    due += every[0]
                if time.time() - due > every[0]:
                    self.skipped += 1
                    due = time.time() + every[0]
        finally:
            if streaming:
                self.connected -= 1
            if call is not None:
                call.cancel()

    async def _listen(self, call: grpc.aio.StreamStreamCall, every: list[float], changed: list[bool]) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.CancelledError):
            while (msg := await call.read()) is not grpc.aio.EOF:
                if msg.WhichOneof("body") == "telemetry_rate" and not self.fixed:
                    new = max(1.0, msg.telemetry_rate.report_interval_s)
                    if new != every[0]:
                        every[0] = new
                        changed[0] = True
                        self.rate_changes += 1

    def stats(self) -> dict:
        return {**super().stats(), "rate_changes": self.rate_changes, "reconnects": self.reconnects}


# ---- orchestrator -------------------------------------------------------------------------------------------------

@dataclass
class Result:
    label: str
    agents: int
    connected: int = 0
    connect_s: float = 0.0
    interval_s: float = 0.0
    ingest: float = 0.0
    offered: float = 0.0
    cpu: float = 0.0
    loop_cpu: float = 0.0
    rss: float = 0.0
    gen_cpu: float = 0.0
    gen_rss: float = 0.0
    reconnects: int = 0
    other_cpu: float = 0.0
    max_age_s: float = math.nan
    stale: int = 0
    no_sample: int = 0
    states: str = ""
    fresh: bool = False


async def node_ages(address: str) -> tuple[list[float], int]:
    """(age of every node's latest sample when its page was answered, nodes without one)."""
    ages: list[float] = []
    missing = 0
    async with grpc.aio.insecure_channel(address, options=[("grpc.max_receive_message_length", 64 << 20)]) as ch:
        stub = admin_pb2_grpc.AdminStub(ch)
        token = ""
        while True:
            asked = time.time()
            page = await stub.ListNodes(admin_pb2.ListNodesRequest(page_size=1000, page_token=token), timeout=60)
            # The page is read at some point between asking and answering: measure from the ask (a node's
            # sample can be no older then than it is at the ask), so a slow page does not count as staleness.
            ages.extend(asked - v.latest.time_unix_s for v in page.nodes if v.has_latest)
            missing += sum(1 for v in page.nodes if not v.has_latest)
            token = page.next_page_token
            if not token:
                return ages, missing


async def status(address: str) -> admin_pb2.ClusterStatus:
    async with grpc.aio.insecure_channel(address) as ch:
        return await admin_pb2_grpc.AdminStub(ch).GetStatus(admin_pb2.GetStatusRequest(), timeout=30)


async def run_one(args: argparse.Namespace, label: str, agents: int, fixed: bool, tmp: Path) -> Result:
    res = Result(label, agents)
    etcd = EmbeddedEtcd(tmp / f"etcd-{label}")
    await asyncio.to_thread(etcd.start)
    coord = None
    gens = []
    try:
        address, metrics = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        budget = ["--ingest-budget", "1e9"] if fixed else (["--ingest-budget", str(args.budget)] if args.budget
                                                            else [])
        coord = Proc(coordinator_argv(address, etcd.endpoints, "/bench/", tmp / f"coord-{label}",
                                      metrics_listen=metrics,
                                      extra=["--history", str(args.history), "--lost-grace", "120",
                                             "--lease-ttl", str(args.lease_ttl), *budget]),
                     tmp / f"coordinator-{label}.log").start()
        wait_leader(address, proc=coord)
        gen_args = argparse.Namespace(generators=args.generators, streams_per_channel=args.streams_per_channel,
                                      interval=1.0, heartbeats=False)
        gens = await start_generators(gen_args, address, tmp, label, script=Path(__file__).resolve(),
                                      extra=(("--fixed",) if fixed else ()))
        t0 = time.monotonic()
        have = 0
        step = args.connect_step
        while have < agents:   # in steps, so the coordinator's interval follows the growing node count
            new = list(range(have, min(agents, have + step)))
            answers = await asyncio.gather(*(
                g.ask({"cmd": "add", "indices": new[i::len(gens)], "timeout_s": args.connect_timeout},
                      timeout_s=args.connect_timeout + 60) for i, g in enumerate(gens)))
            have += len(new)
            failed = sum(a["failed"] for a in answers)
            st = await status(address)
            print(f"  [{label}] {have - failed}/{have} agents registered after {time.monotonic() - t0:.0f}s, "
                  f"interval {st.telemetry_rate.report_interval_s:g}s, ingest {st.telemetry_rate.ingest_per_s:.0f}/s, "
                  f"coordinator RSS {psutil.Process(coord.pid).memory_info().rss / 2**20:.0f} MB", flush=True)
            if failed > 0.01 * len(new):
                print(f"  [{label}] {failed} agents not registered: stopping the ramp here", flush=True)
                break
        res.connect_s = time.monotonic() - t0
        await asyncio.sleep(args.settle)
        meters = [CpuMeter(coord.pid), *(CpuMeter(g.proc.pid) for g in gens)]
        for m in meters:
            m.start()
        psutil.cpu_percent()
        before = [await g.ask({"cmd": "stats"}) for g in gens]
        c0, ta, _ = await asyncio.to_thread(scrape_samples, metrics)
        await asyncio.sleep(args.window)
        c1, tb, _ = await asyncio.to_thread(scrape_samples, metrics)
        after = [await g.ask({"cmd": "stats"}) for g in gens]
        host_cpu = psutil.cpu_percent() * (os.cpu_count() or 1)
        res.cpu, res.rss = meters[0].read()
        res.loop_cpu = meters[0].main_pct
        res.gen_cpu = sum(m.read()[0] for m in meters[1:])
        res.other_cpu = max(0.0, host_cpu - res.cpu - res.gen_cpu)
        res.ingest = (c1 - c0) / (tb - ta)
        res.offered = sum(a["sent"] - b["sent"] for a, b in zip(after, before, strict=True)) / (tb - ta)
        res.connected = sum(a["connected"] for a in after)
        res.reconnects = sum(a["reconnects"] for a in after)
        st = await status(address)
        res.interval_s = st.telemetry_rate.report_interval_s
        res.states = ", ".join(f"{c.key} {c.count}" for c in st.nodes_by_state)
        res.gen_rss = sum(psutil.Process(g.proc.pid).memory_info().rss for g in gens) / 2**20
        ages, res.no_sample = await node_ages(address)
        res.max_age_s = max(ages) if ages else math.nan
        res.stale = sum(1 for a in ages if a > args.fresh)
        ready = sum(c.count for c in st.nodes_by_state if c.key == "ready")
        res.fresh = res.stale == 0 and res.no_sample == 0 and len(ages) == agents and ready == agents
        return res
    finally:
        for g in gens:
            await g.stop()
        if coord is not None:
            coord.stop()
        await asyncio.to_thread(etcd.stop)


HEADER = (f"{'run':<10}{'agents':>7}{'conn s':>7}{'interval':>9}{'offered/s':>10}{'ingest/s':>9}{'cpu %':>7}"
          f"{'loop %':>7}{'rss MB':>8}{'gen cpu%':>9}{'gen MB':>7}{'other%':>7}{'max age':>8}{'stale':>6}"
          f"{'reconn':>7}  states / fresh")


def fmt(r: Result, fresh_s: float) -> str:
    return (f"{r.label:<10}{r.agents:>7}{r.connect_s:>7.0f}{r.interval_s:>8g}s{r.offered:>10.0f}{r.ingest:>9.0f}"
            f"{r.cpu:>7.0f}{r.loop_cpu:>7.0f}{r.rss:>8.0f}{r.gen_cpu:>9.0f}{r.gen_rss:>7.0f}{r.other_cpu:>7.0f}"
            f"{r.max_age_s:>7.1f}s{r.stale:>6}{r.reconnects:>7}  {r.states}; "
            f"every node fresh within {fresh_s:g}s: {'yes' if r.fresh else 'NO'}")


async def orchestrate(args: argparse.Namespace) -> None:
    with work_dir(args.keep_dir, "gptrm-bench-rate-") as tmp:
        print(f"machine: {os.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB; load average "
              f"{', '.join(f'{x:.1f}' for x in os.getloadavg())} at the start", flush=True)
        results = []
        if args.baseline_agents:
            print(f"baseline: {args.baseline_agents} agents at a fixed 1 Hz (agents ignore the rate)", flush=True)
            results.append(await run_one(args, "fixed-1Hz", args.baseline_agents, True, tmp))
        print(f"adaptive: {args.agents} agents following the coordinator's report interval", flush=True)
        results.append(await run_one(args, "adaptive", args.agents, False, tmp))
        print(f"load average at the end: {', '.join(f'{x:.1f}' for x in os.getloadavg())}")
        print(HEADER)
        for r in results:
            print(fmt(r, args.fresh))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--agents", type=int, default=30_000, help="simulated agents of the adaptive run")
    p.add_argument("--baseline-agents", type=int, default=3_000,
                   help="agents of the fixed 1 Hz baseline (0: skip)")
    p.add_argument("--budget", type=float, default=0.0, help="--ingest-budget of the coordinator (0: its default)")
    p.add_argument("--history", type=float, default=60.0, help="--history of the coordinator, seconds")
    p.add_argument("--lease-ttl", type=float, default=10.0, help="--lease-ttl of the coordinator, seconds")
    p.add_argument("--generators", type=int, default=1, help="load-generator processes")
    p.add_argument("--streams-per-channel", type=int, default=50)
    p.add_argument("--connect-step", type=int, default=2_000, help="agents added per ramp step")
    p.add_argument("--connect-timeout", type=float, default=300.0)
    p.add_argument("--settle", type=float, default=20.0, help="seconds after the last registration")
    p.add_argument("--window", type=float, default=20.0, help="measurement window, seconds")
    p.add_argument("--fresh", type=float, default=15.0, help="a node is fresh when its latest sample is this young")
    p.add_argument("--keep-dir", default="")
    p.add_argument("--role", choices=("orchestrator", "generator"), default="orchestrator", help=argparse.SUPPRESS)
    p.add_argument("--target", help=argparse.SUPPRESS)
    p.add_argument("--interval", type=float, default=1.0, help=argparse.SUPPRESS)
    p.add_argument("--heartbeats", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--fixed", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.role == "generator":
        asyncio.run(generator_main(args, RateGenerator(args.target, args.streams_per_channel, args.fixed)))
    else:
        asyncio.run(orchestrate(args))


if __name__ == "__main__":
    main()
