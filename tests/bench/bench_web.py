"""Benchmark: the web console's Fleet page over a large simulated fleet.

Run: ``.venv/bin/python tests/bench/bench_web.py [--nodes 5000] [--browsers 1,10,50] [--window 20]``.

It starts an embedded etcd, one ``gptrm-coordinator`` with ``--web-listen`` (open mode, ``--insecure``)
and the telemetry bench's agent generators (``bench_ingest.py --role generator``: lightweight agent
streams, 8 simulated H100 GPUs each, one sample per agent per ``--interval``, utilization alternating
between two values, so every GPU's colour changes at every sample: the worst case for updates). Then:

- **first render**: ``GET /`` (gzip, as a browser asks) ``--renders`` times: the first (cold) and the
  median time to the whole answer, its size compressed and raw;
- **payload**: what a browser transfers for the page: the HTML plus the stylesheet and script it loads
  (compressed), against the target of 500 KB at 5,000 nodes;
- **updates**: for each count of ``--browsers``, that many live streams of the page
  (``/live/fleet``, each from its own render's baseline) for ``--window`` seconds: deltas received per
  browser, their mean interval and size as transferred (gzip), bytes per second per browser, and the coordinator's CPU
  (% of one core, its whole process) against the same window with no browser: the CPU each added
  browser costs.

Figures are wall-clock on this machine; the CPU figures are the coordinator process's own CPU time.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import itertools
import os
import re
import statistics
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_util import CpuMeter, Proc, coordinator_argv, free_port, wait_leader, work_dir

from common.pb.gptrm.v1 import admin_pb2, admin_pb2_grpc
from coordinator.etcd_embedded import EmbeddedEtcd

INGEST = Path(__file__).resolve().parent / "bench_ingest.py"
TARGET_BYTES = 500 * 1024


@dataclass
class Stream:
    deltas: int = 0
    bytes: int = 0
    times: list[float] | None = None


async def render(session: aiohttp.ClientSession, base: str) -> tuple[float, int, int, str]:
    """(seconds, compressed bytes, raw bytes, html) of one ``GET /``."""
    started = time.monotonic()
    async with session.get(f"{base}/", headers={"Accept-Encoding": "gzip"}, auto_decompress=False) as r:
        body = await r.read()
        encoding = r.headers.get("Content-Encoding", "")
    took = time.monotonic() - started
    raw = gzip.decompress(body) if encoding == "gzip" else body
    return took, len(body), len(raw), raw.decode()


async def asset_bytes(session: aiohttp.ClientSession, base: str, html: str) -> dict[str, int]:
    out = {}
    for src in re.findall(r'(?:href|src)="(/static/[^"]+)"', html):
        async with session.get(base + src.replace("&amp;", "&"), headers={"Accept-Encoding": "gzip"},
                               auto_decompress=False) as r:
            out[src.split("?")[0]] = len(await r.read())
    return out


async def follow(session: aiohttp.ClientSession, base: str, live: str, stream: Stream, stop: asyncio.Event) -> None:
    """Read one live stream as a browser does (gzip), counting the bytes transferred and the deltas."""
    stream.times = []
    async with session.get(base + live.replace("&amp;", "&"), headers={"Accept-Encoding": "gzip"},
                           timeout=aiohttp.ClientTimeout(total=None)) as r:
        unzip = zlib.decompressobj(31) if r.headers.get("Content-Encoding") == "gzip" else None

        async def read() -> None:
            async for chunk in r.content.iter_any():
                stream.bytes += len(chunk)
                text = unzip.decompress(chunk) if unzip is not None else chunk
                for _ in range(text.count(b"event: delta")):
                    stream.deltas += 1
                    assert stream.times is not None
                    stream.times.append(time.monotonic())
        reader = asyncio.create_task(read())
        await stop.wait()
        reader.cancel()


async def wait_nodes(address: str, n: int, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    async with grpc.aio.insecure_channel(address) as ch:
        stub = admin_pb2_grpc.AdminStub(ch)
        count = 0
        while time.monotonic() < deadline:
            s = await stub.GetStatus(admin_pb2.GetStatusRequest(), timeout=10)
            count = sum(c.count for c in s.nodes_by_state if c.key.lower() in ("ready", "node_state_ready"))
            if count >= n:
                return count
            await asyncio.sleep(1.0)
        return count


async def run(args: argparse.Namespace, tmp: Path) -> None:
    sys.path.insert(0, str(INGEST.parent))
    import bench_ingest  # its generator and process helpers

    etcd = EmbeddedEtcd(tmp / "etcd")
    coord: Proc | None = None
    gens: list = []
    try:
        await asyncio.to_thread(etcd.start)
        listen, web = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        coord = Proc(coordinator_argv(listen, etcd.endpoints, f"/bench/web-{os.getpid()}/", tmp / "coordinator",
                                      metrics_listen=f"127.0.0.1:{free_port()}", extra=["--web-listen", web]),
                     tmp / "coordinator.log").start()
        await asyncio.to_thread(wait_leader, listen, 60.0, coord)
        gens = await bench_ingest.start_generators(args, listen, tmp, "web", script=INGEST)
        per = -(-args.nodes // len(gens))
        for g, gen in enumerate(gens):
            indices = list(range(g * per, min(args.nodes, (g + 1) * per)))
            for at in range(0, len(indices), 500):
                await gen.ask({"cmd": "add", "indices": indices[at:at + 500], "timeout_s": 120})
        ready = await wait_nodes(listen, args.nodes, 180.0)
        print(f"web console bench: {ready} nodes × {bench_ingest.GPUS} GPUs, one sample per "
              f"{args.interval:g}s each, {os.cpu_count()} CPUs", flush=True)
        await asyncio.sleep(args.warmup)
        base = f"http://{web}"
        async with aiohttp.ClientSession(auto_decompress=False) as session:
            renders = []
            for _ in range(args.renders):   # apart by more than the console's 1 s cache: each render computes
                renders.append(await render(session, base))
                await asyncio.sleep(1.2)
            took = [r[0] for r in renders]
            _, gz, raw, html = renders[-1]
            assets = await asset_bytes(session, base, html)
            total = gz + sum(assets.values())
            print(f"first render (GET /, no cache): first {took[0] * 1000:.0f} ms, median of {len(took)} "
                  f"{statistics.median(took) * 1000:.0f} ms; HTML {gz / 1024:.0f} KB gzip ({raw / 1024:.0f} KB raw)")
            parts = ", ".join(f"{k} {v / 1024:.1f} KB" for k, v in [("HTML", gz), *assets.items()])
            print(f"payload (compressed): {parts} → total {total / 1024:.0f} KB; target ≤ {TARGET_BYTES // 1024} KB: "
                  f"{'met' if total <= TARGET_BYTES else 'NOT met'}")
            meter = CpuMeter(coord.pid)
            meter.start()
            await asyncio.sleep(args.window)
            idle_cpu, rss = meter.read()
            print(f"coordinator with no browser: {idle_cpu:.0f}% CPU, RSS {rss:.0f} MB")
            for n in [int(b) for b in args.browsers.split(",") if b]:
                pages = [await render(session, base) for _ in range(n)]
                lives = [re.search(r'data-live="([^"]+)"', p[3]).group(1) for p in pages]   # type: ignore[union-attr]
                streams = [Stream() for _ in range(n)]
                stop = asyncio.Event()
                tasks = [asyncio.create_task(follow(session, base, live, s, stop))
                         for live, s in zip(lives, streams, strict=True)]
                meter.start()
                await asyncio.sleep(args.window)
                cpu, rss = meter.read()
                stop.set()
                await asyncio.gather(*tasks, return_exceptions=True)
                deltas = statistics.mean(s.deltas for s in streams)
                gaps = [b - a for s in streams for a, b in itertools.pairwise(s.times or [])]
                per_s = statistics.mean(s.bytes for s in streams) / args.window
                size = statistics.mean(s.bytes / s.deltas for s in streams if s.deltas) if deltas else 0.0
                print(f"{n:4d} browsers: {deltas:.1f} deltas each in {args.window:g}s (mean interval "
                      f"{statistics.mean(gaps) if gaps else float('nan'):.1f}s, {size / 1024:.0f} KB each), "
                      f"{per_s / 1024:.1f} KB/s per browser; coordinator {cpu:.0f}% CPU (+{cpu - idle_cpu:.0f}% "
                      f"over none: {(cpu - idle_cpu) / n:.1f}% per browser), RSS {rss:.0f} MB", flush=True)
    finally:
        for g in gens:
            await g.stop()
        if coord is not None:
            coord.stop(timeout_s=60)
        await asyncio.to_thread(etcd.stop)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=5000)
    p.add_argument("--browsers", default="1,10,50", help="live streams open at once, per step")
    p.add_argument("--window", type=float, default=20.0, help="seconds per measurement")
    p.add_argument("--warmup", type=float, default=5.0, help="seconds after every node registered")
    p.add_argument("--renders", type=int, default=5, help="GET / this many times for the render figures")
    p.add_argument("--interval", type=float, default=1.0, help="each agent's sampling interval, seconds")
    p.add_argument("--generators", type=int, default=2, help="load-generator processes")
    p.add_argument("--streams-per-channel", type=int, default=50, help="agent streams per gRPC channel")
    p.add_argument("--keep-dir", default="", help="keep state and logs in this directory")
    args = p.parse_args()
    args.heartbeats = False
    with work_dir(args.keep_dir, "gptrm-bench-web-") as tmp:
        asyncio.run(run(args, tmp))


if __name__ == "__main__":
    main()
