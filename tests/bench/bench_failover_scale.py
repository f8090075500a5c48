"""Failover at scale: thousands of simulated agents streaming, the leader killed (-9), time until the new leader
has every node READY again and places a new task.

Run: ``.venv/bin/python tests/bench/bench_failover_scale.py [--agents 5000] [--kills 3] [--generators 2]``.

It starts one embedded etcd and three ``gptrm-coordinator`` processes on loopback (``--insecure``), then the
soak's simulated agents (``tests/bench/soak.py``: 8 simulated H100 GPUs each, telemetry at 1 Hz, a Redirect
followed after a random wait up to ``--redirect-jitter`` like the agent's flag, any other failure retried on the
next coordinator after a jittered backoff). Once every agent registered and the leader shows them all READY, the
leader is killed with -9 and restarted on its address as a standby, ``--kills`` times. For each kill it prints:

- **leader**: kill → one replica answering as leader;
- **all READY**: kill → the new leader counting every node READY (``GetStatus``);
- **placed**: kill → a one-GPU task submitted to the new leader right after it leads is SCHEDULED or RUNNING;
- **split brain**: polls (every 0.1 s) where more than one replica answered as leader.

Target: all READY and the task placed within 10 s of the kill. **Baseline in the same run**: the same three
figures for a kill with no agent connected (what the lease TTL and the take-over cost alone).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import statistics
import sys
import time
import uuid
from pathlib import Path

import grpc
import grpc.aio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_util import REPO, work_dir
from bench_ingest import generator_main, start_generators
from soak import COORDINATORS, SoakGenerator, _interrupted

from common.pb.gptrm.v1 import admin_pb2, admin_pb2_grpc, types_pb2
from coordinator.etcd_embedded import EtcdCluster
from tests.integration.harness import Cluster

TARGET_S = 10.0
_READY = "ready"


async def _status(address: str) -> admin_pb2.ClusterStatus | None:
    with contextlib.suppress(grpc.aio.AioRpcError):
        async with grpc.aio.insecure_channel(address) as ch:
            return await admin_pb2_grpc.AdminStub(ch).GetStatus(admin_pb2.GetStatusRequest(), timeout=2)
    return None


async def _leading(cluster: Cluster) -> list[tuple[str, admin_pb2.ClusterStatus]]:
    """Every replica answering as leader now, with its status (one GetStatus per replica a poll: on the
    leader it counts every node, which the bench should not spend the leader's time on twice)."""
    names = [n for n in COORDINATORS if cluster.proc(n).alive]
    answers = await asyncio.gather(*(_status(cluster.address(n)) for n in names))
    return [(n, s) for n, s in zip(names, answers, strict=True) if s is not None and s.is_leader]


async def _leaders(cluster: Cluster) -> list[str]:
    """Every replica answering as leader now."""
    return [n for n, _ in await _leading(cluster)]


def _ready(status: admin_pb2.ClusterStatus) -> int:
    return sum(int(c.count) for c in status.nodes_by_state if c.key == _READY)


async def _submit(address: str) -> str:
    spec = types_pb2.TaskSpec(name="after-failover", kind=types_pb2.TASK_KIND_TRAINING, argv=["sleep", "30"],
                              has_demand=True, demand=types_pb2.ResourceVector(gpus=1, cpu_cores=0.1))
    async with grpc.aio.insecure_channel(address) as ch:
        task = await admin_pb2_grpc.AdminStub(ch).SubmitTask(
            admin_pb2.SubmitTaskRequest(spec=spec, request_id=uuid.uuid4().hex), timeout=5)
    return task.id


async def _placed(address: str, task_id: str) -> bool:
    with contextlib.suppress(grpc.aio.AioRpcError):
        async with grpc.aio.insecure_channel(address) as ch:
            t = await admin_pb2_grpc.AdminStub(ch).GetTask(admin_pb2.GetTaskRequest(task_id=task_id), timeout=2)
            return t.state in (types_pb2.TASK_STATE_SCHEDULED, types_pb2.TASK_STATE_STARTING,
                               types_pb2.TASK_STATE_RUNNING, types_pb2.TASK_STATE_SUCCEEDED)
    return False


async def _kill_once(cluster: Cluster, flags: tuple[str, ...], agents: int, timeout_s: float) -> dict[str, float]:
    """Kill the leader; the times to a new leader, to every node READY on it, and to a new task placed (none is
    submitted without agents: nothing could take it)."""
    leaders = await _leaders(cluster)
    assert len(leaders) == 1, leaders
    victim = leaders[0]
    t0 = time.monotonic()
    cluster.proc(victim).kill()
    cluster.start_coordinator(victim, *flags)   # back on its address, as a standby (it may win again)
    nan = float("nan")
    out = {"leader": nan, "ready": nan, "placed": nan if agents else 0.0, "split": 0.0}
    task_id = ""
    while time.monotonic() - t0 < timeout_s:
        now = await _leading(cluster)
        if len(now) > 1:
            out["split"] += 1
        elif len(now) == 1:
            elapsed = time.monotonic() - t0
            if out["leader"] != out["leader"]:
                out["leader"] = elapsed
            address, status = cluster.address(now[0][0]), now[0][1]
            if agents and not task_id:
                with contextlib.suppress(grpc.aio.AioRpcError):
                    task_id = await _submit(address)
            if out["ready"] != out["ready"] and _ready(status) >= agents:
                out["ready"] = time.monotonic() - t0
            if task_id and out["placed"] != out["placed"] and await _placed(address, task_id):
                out["placed"] = time.monotonic() - t0
            if out["ready"] == out["ready"] and out["placed"] == out["placed"]:
                return out
        await asyncio.sleep(0.1)
    leaders = await _leaders(cluster)
    status = await _status(cluster.address(leaders[0])) if len(leaders) == 1 else None
    if status is not None:
        print(f"  timed out: nodes by state {dict((c.key, c.count) for c in status.nodes_by_state)}", flush=True)
    return out


def _agent_stats(before: list[dict], after: list[dict]) -> str:
    """What the simulated agents went through between two ``stats`` answers of every generator."""
    redirects = sum(a["redirects"] - b["redirects"] for a, b in zip(after, before, strict=True))
    failures: dict[str, int] = {}
    longest: dict[str, float] = {}
    for a, b in zip(after, before, strict=True):
        for reason, n in a["failures"].items():
            failures[reason] = failures.get(reason, 0) + n - b["failures"].get(reason, 0)
            longest[reason] = max(longest.get(reason, 0.0), a["failure_max_s"].get(reason, 0.0))
    failed = ", ".join(f"{reason} {n} (longest {longest[reason]:.1f}s)" for reason, n in sorted(failures.items()) if n)
    return f"{redirects} redirects followed; failed sessions: {failed or 'none'}"


def _row(label: str, r: dict[str, float]) -> str:
    worst = max(r["ready"], r["placed"])
    verdict = "ok" if worst <= TARGET_S else "OVER"
    return (f"{label:<22} leader {r['leader']:6.2f}s  all READY {r['ready']:6.2f}s  placed {r['placed']:6.2f}s  "
            f"split-brain polls {int(r['split'])}  {verdict}")


async def orchestrate(args: argparse.Namespace, tmp: Path) -> None:
    print(f"failover at scale: {args.agents} simulated agents × 8 GPUs at 1 Hz, {args.generators} generator "
          f"process(es), {args.kills} kill(s) -9 of the leader; {os.cpu_count()} CPUs", flush=True)
    etcd = EtcdCluster(tmp / "etcd", size=1)
    await asyncio.to_thread(etcd.start)
    cluster = Cluster(tmp, etcd.endpoints, f"/failover-scale-{os.getpid()}/")
    flags = tuple(args.coordinator_args.split())
    gens = []
    try:
        for name in COORDINATORS:
            cluster.start_coordinator(name, *flags)
        while len(await _leaders(cluster)) != 1:
            await asyncio.sleep(0.1)
        baseline = await _kill_once(cluster, flags, 0, 60)
        print(_row("baseline (no agents)", baseline), flush=True)
        addresses = [cluster.address(n) for n in COORDINATORS]
        gens = await start_generators(args, ",".join(addresses), tmp, "fs", script=Path(__file__).resolve(),
                                      extra=("--redirect-jitter", str(args.redirect_jitter)))
        t0 = time.monotonic()
        answers = await asyncio.gather(*(
            g.ask({"cmd": "add", "indices": list(range(args.agents))[i::len(gens)], "timeout_s": 600},
                  timeout_s=700) for i, g in enumerate(gens)))
        failed = sum(a["failed"] for a in answers)
        print(f"{args.agents - failed} of {args.agents} agents registered in {time.monotonic() - t0:.1f}s "
              f"({(args.agents - failed) / (time.monotonic() - t0):.0f}/s)", flush=True)
        results = []
        for k in range(args.kills):
            end = time.monotonic() + 120
            while time.monotonic() < end:   # every node READY on the leader before the kill
                leaders = await _leaders(cluster)
                status = await _status(cluster.address(leaders[0])) if len(leaders) == 1 else None
                if status is not None and _ready(status) >= args.agents - failed:
                    break
                await asyncio.sleep(0.5)
            await asyncio.sleep(args.settle)
            before = [await g.ask({"cmd": "stats"}, timeout_s=30) for g in gens]
            killed_at = time.time()
            r = await _kill_once(cluster, flags, args.agents - failed, 120)
            results.append(r)
            print(_row(f"kill {k + 1}", r), flush=True)
            after = [await g.ask({"cmd": "stats"}, timeout_s=30) for g in gens]
            print("  agents meanwhile: " + _agent_stats(before, after), flush=True)
            if args.trace:
                traces = [t for g in gens for t in await g.ask({"cmd": "trace", "since": killed_at,
                                                                "slowest": args.trace}, timeout_s=30)]
                traces.sort(key=lambda t: -1 if t["welcomed"] is None else t["welcomed"], reverse=True)
                for t in traces[:args.trace]:
                    print(f"    agent {t['agent']}: " + "; ".join(f"{at}s {what} ({who})" for at, what, who
                                                             in t["history"]), flush=True)
        worst = [max(r["ready"], r["placed"]) for r in results]
        print(f"\nkill → every node READY and a new task placed, over {len(worst)} kills: min {min(worst):.2f}s, "
              f"p50 {statistics.median(worst):.2f}s, max {max(worst):.2f}s (target ≤ {TARGET_S:g}s); "
              f"split-brain polls {int(sum(r['split'] for r in results))}; baseline without agents "
              f"{max(baseline['ready'], baseline['placed']):.2f}s")
    finally:
        for g in gens:
            await g.stop()
        for name in COORDINATORS:
            if name in cluster.coordinators:
                cluster.proc(name).stop()
        await asyncio.to_thread(etcd.stop)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--agents", type=int, default=5000, help="simulated agents (8 GPUs each)")
    p.add_argument("--kills", type=int, default=3, help="leader kills")
    p.add_argument("--generators", type=int, default=2, help="load-generator processes")
    p.add_argument("--streams-per-channel", type=int, default=50, help="agent streams per gRPC channel")
    p.add_argument("--interval", type=float, default=1.0, help="telemetry interval of every agent, seconds")
    p.add_argument("--backoff-max", type=float, default=2.0, help="agents' longest reconnect backoff, seconds")
    p.add_argument("--redirect-jitter", type=float, default=1.0, help="agents' --redirect-jitter, seconds")
    p.add_argument("--settle", type=float, default=5.0, help="seconds of steady streaming before each kill")
    p.add_argument("--coordinator-args", default="", help="extra coordinator flags, space-separated")
    p.add_argument("--trace", type=int, default=0, help="after each kill, print the session outcomes of the "
                   "N agents welcomed last")
    p.add_argument("--keep-dir", default="", help="keep state and logs in this directory instead of a temporary one")
    p.add_argument("--role", choices=("orchestrator", "generator"), default="orchestrator", help=argparse.SUPPRESS)
    p.add_argument("--target", help=argparse.SUPPRESS)
    p.add_argument("--heartbeats", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.role == "generator":
        gen = SoakGenerator(args.target.split(","), args.streams_per_channel, args.interval, args.backoff_max,
                            redirect_jitter_s=args.redirect_jitter)
        asyncio.run(generator_main(args, gen))
    else:
        signal.signal(signal.SIGTERM, _interrupted)
        os.chdir(REPO)
        with work_dir(args.keep_dir, "gptrm-failover-scale-") as tmp:
            asyncio.run(orchestrate(args, tmp))


if __name__ == "__main__":
    main()
