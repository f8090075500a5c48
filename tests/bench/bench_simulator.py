"""Benchmark: the Philly week replayed on 100 of its servers under all six policies.

Run: ``.venv/bin/python tests/bench/bench_simulator.py [--traces DIR] [--nodes-limit 100]
[--power-down-after S] [--series]``. It reads ``philly_jobs.csv``/``philly_nodes.csv`` from
``--traces`` (default ``$GPTRM_TRACES``; without either it says so and exits 0: no trace ships with the
repository), builds the cluster and the profiled requests once, then
replays every policy and prints, per policy, the wall time, the events processed and the
events/s rate, and the total. The target is the whole set in under 60 s on a 2-core machine.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere in the checkout

from common.errors import GptrmError
from coordinator.simulator.cli import DEFAULT_POLICIES
from coordinator.simulator.engine import SimConfig, Simulator
from coordinator.simulator.replay import ReplaySetup, load
from coordinator.simulator.trace import TRACES_ENV, traces_dir

TARGET_S = 60.0


def main() -> int:
    """Run the benchmark; returns 0, or 1 when the total exceeds the target."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--traces", type=Path, help=f"traces directory (default ${TRACES_ENV})")
    p.add_argument("--nodes-limit", type=int, default=100)
    p.add_argument("--power-down-after", type=float, default=None)
    p.add_argument("--series", action="store_true", help="also record the plot series (as gptrmctl simulate does)")
    args = p.parse_args()
    try:
        traces = traces_dir(args.traces)
    except GptrmError as e:
        print(f"bench_simulator: skipped: {e}")
        return 0
    started = time.perf_counter()
    cluster, jobs = load(ReplaySetup(traces / "philly_jobs.csv", traces / "philly_nodes.csv",
                                     args.nodes_limit))  # fmt: skip
    load_s = time.perf_counter() - started
    gpus = sum(n.capacity.gpus for n in cluster.nodes)
    print(f"philly week: {len(jobs):,} jobs on {len(cluster.nodes)} servers ({gpus:g} GPUs); "
          f"load + profile {load_s:.2f} s")  # fmt: skip
    print(f"{'policy':<17} {'wall s':>7} {'events':>8} {'events/s':>10} {'mean JCT s':>11}")
    total = 0.0
    for policy in DEFAULT_POLICIES:
        config = SimConfig(policy, power_down_after_s=args.power_down_after, keep_series=args.series)
        t0 = time.perf_counter()
        result = Simulator(cluster, jobs, config).run()
        wall = time.perf_counter() - t0
        total += wall
        print(f"{policy:<17} {wall:7.2f} {result.events:8,} {result.events / wall:10,.0f} "
              f"{result.metrics['jct_mean_s']:11,.0f}")  # fmt: skip
    print(f"{'all six':<17} {total:7.2f} s replay, {total + load_s:.2f} s with loading (target < {TARGET_S:g} s)")
    return 0 if total + load_s < TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
