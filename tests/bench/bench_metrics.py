"""/metrics scrape cost: the coordinator's exposition of N nodes × 8 GPUs against prometheus-client's rendering.

Run with ``.venv/bin/python tests/bench/bench_metrics.py [--nodes 500,2000,3500] [--repeat 3]``.

Each node's latest sample carries the fields a real agent sends (9 per-GPU gauges), so at 2,000
nodes the answer has 144,000 per-GPU lines. For every size it prints the CPU time of one scrape
answer — plain text, and gzip-compressed as Prometheus asks for it — for the coordinator's
:meth:`Metrics.exposition` and, as the baseline in the same run, for the same registry with the
per-GPU gauges rendered by prometheus-client itself (``generate_latest`` over sample objects,
gzip level 9 as its HTTP server does). The fastest of ``--repeat`` runs counts.
"""

from __future__ import annotations

import argparse
import gzip
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from prometheus_client import generate_latest  # noqa: E402

from common.pb.gptrm.v1 import types_pb2  # noqa: E402
from coordinator.monitor.metrics import Metrics  # noqa: E402
from coordinator.monitor.nodes import NodeRegistry  # noqa: E402
from coordinator.monitor.resources import ResourceMonitor  # noqa: E402

GPUS = 8


def load_baseline() -> type:
    """prometheus-client's rendering of the per-GPU gauges, from the tests' reference module."""
    from tests.helpers.metrics_reference import ClientRendered

    return ClientRendered


def cluster(n_nodes: int) -> tuple[ResourceMonitor, NodeRegistry]:
    """``n_nodes`` registered nodes with one full telemetry sample each."""
    monitor, registry = ResourceMonitor(history_s=2, interval_s=1), NodeRegistry(1.0, 5.0)
    for n in range(n_nodes):
        node_id = f"gpu-node-{n:05d}"
        registry.connect(types_pb2.NodeInventory(node_id=node_id, gpus=[
            types_pb2.GpuInfo(index=i, model="NVIDIA H100 80GB HBM3") for i in range(GPUS)]), outbox=None)
        sample = types_pb2.TelemetrySample(time_unix_s=1.0)
        for i in range(GPUS):
            sample.gpus.add(index=i, util_gpu=0.01 * ((n + i) % 100), util_mem=0.4, mem_used_bytes=(n % 80) << 30,
                            mem_total_bytes=80 << 30, power_w=120.0 + (n + i) % 500, power_limit_w=700.0,
                            energy_j=1.5e9 + n, temperature_c=40.0 + i, sm_clock_mhz=1980, simulated=True)
        monitor.ingest(node_id, GPUS, [sample])
    return monitor, registry


def best(fn: Callable[[], bytes], repeat: int) -> tuple[float, int]:
    """(fastest CPU seconds of ``repeat`` calls, size of the answer)."""
    fastest, size = float("inf"), 0
    for _ in range(repeat):
        start = time.process_time()
        size = len(fn())
        fastest = min(fastest, time.process_time() - start)
    return fastest, size


def main() -> None:
    """Print one row per size."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="500,2000,3500", help="comma-separated node counts")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    client_rendered = load_baseline()
    print(f"{'nodes':>6} {'GPU lines':>10} {'MB':>6} {'text s':>8} {'gzip s':>8} "
          f"{'baseline text s':>16} {'baseline gzip s':>16} {'speed-up':>9}")
    for n in (int(x) for x in args.nodes.split(",")):
        monitor, registry = cluster(n)
        metrics = Metrics(monitor, registry, dict)
        baseline = Metrics(monitor, registry, dict)
        baseline.registry.register(client_rendered(monitor, registry))
        ours, size = best(lambda m=metrics: m.exposition()[0], args.repeat)
        ours_gz, _ = best(lambda m=metrics: gzip.compress(m.exposition()[0], compresslevel=1), args.repeat)
        theirs, _ = best(lambda b=baseline: generate_latest(b.registry), args.repeat)
        theirs_gz, _ = best(lambda b=baseline: gzip.compress(generate_latest(b.registry)), args.repeat)
        print(f"{n:>6} {n * GPUS * 9:>10,} {size / 1e6:>6.1f} {ours:>8.3f} {ours_gz:>8.3f} "
              f"{theirs:>16.3f} {theirs_gz:>16.3f} {theirs_gz / ours_gz:>8.1f}x")


if __name__ == "__main__":
    main()
