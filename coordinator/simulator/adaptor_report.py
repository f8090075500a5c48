"""The Resource Adaptor report: round-robin against the paper's policies and time-aware packing, with power-down.

``python -m coordinator.simulator.adaptor_report [--traces DIR] [--max-jobs N] [--out DIR]`` replays
``philly_jobs.csv`` on 100 of ``philly_nodes.csv``'s servers (read where they lie, never copied):

* round-robin with every node on (a static cluster), and Alg. 2 with every node on (how much
  balancing placement alone gets against round-robin's rotation);
* round-robin with the same power-down rule (what Slurm's power saving does);
* Alg. 1 max-utilization, Alg. 2 load-balancing, Alg. 3 power-efficient and time-aware packing,
  each with the adaptor;
* Alg. 1-3 with the adaptor again, deciding in queue order instead of the paper's descending compute
  demand (``--keep-order``): what the paper's batch order costs in mean JCT.

"The same power-down rule" and "the adaptor" are one thing: the production
:class:`coordinator.adaptor.power.PowerManager` with the ``simulated`` node provider. It prints a
markdown table (energy, active node-hours, utilization std-dev, mean and p99 JCT) and one line per
goal against round-robin with power-down: held or not held.

It also prints the floor no placement policy can go under on this workload (:func:`floors`): the
jobs' GPU-hours on nodes that are never idle, never booting, with no spare, each busy GPU costing
the least any node's GPU costs. A goal that asks for a cut larger than round-robin's distance to the
floor is out of reach of every policy, and the report says so.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.errors import GptrmError
from common.logging import configure_logging
from coordinator.domain import ClusterSnapshot
from coordinator.scheduler.policies.base import DEFAULT_THRESHOLD_MODE, limit_factors
from coordinator.simulator.engine import SimConfig
from coordinator.simulator.metrics import JobRecord
from coordinator.simulator.replay import ProgressBar, ReplaySetup, load, run_policies
from coordinator.simulator.trace import TRACES_ENV, traces_dir

__all__ = ["RUNS", "Goal", "floors", "goal_lines", "main", "table"]

Metrics = Mapping[str, Any]

RR_ON, RR_PD = "round-robin, every node on", "round-robin + power-down"
ALG1, ALG2, ALG3, TIME = ("Alg. 1 max-utilization + adaptor", "Alg. 2 load-balancing + adaptor",
                          "Alg. 3 power-efficient + adaptor", "time-aware + adaptor")
FIFO = ", queue order"
ALG2_ON = "Alg. 2 load-balancing, every node on"
RUNS: tuple[tuple[str, str, bool, bool], ...] = (
    (RR_ON, "round-robin", False, False), (ALG2_ON, "load-balancing", False, False),
    (RR_PD, "round-robin", True, False),
    (ALG1, "max-utilization", True, False), (ALG2, "load-balancing", True, False),
    (ALG3, "power-efficient", True, False), (TIME, "time-aware", True, False),
    (ALG1 + FIFO, "max-utilization", True, True), (ALG2 + FIFO, "load-balancing", True, True),
    (ALG3 + FIFO, "power-efficient", True, True),
)
"""(row name, policy, with the adaptor, decisions in queue order)."""


@dataclass(frozen=True, slots=True)
class Goal:
    """A goal against round-robin with power-down: ``runs`` (any of them) lower ``key`` by ≥ ``gain``."""

    what: str
    runs: tuple[str, ...]
    key: str
    gain: float


GOALS = (
    Goal("Alg. 1 ≥ 15 % fewer active node-hours", (ALG1,), "active_node_hours", 0.15),
    Goal("Alg. 2 ≥ 40 % lower utilization std-dev", (ALG2,), "util_std", 0.40),
    Goal("Alg. 3 or time-aware ≥ 15 % less energy", (ALG3, TIME), "energy_kwh", 0.15),
)

_COLUMNS = (("energy kWh", "energy_kwh", 1.0, "{:,.1f}"), ("active node-h", "active_node_hours", 1.0, "{:,.1f}"),
            ("busy node-h", "busy_node_hours", 1.0, "{:,.1f}"),
            ("util std", "util_std", 1.0, "{:.3f}"), ("JCT mean s", "jct_mean_s", 1.0, "{:,.0f}"),
            ("JCT p99 s", "jct_p99_s", 1.0, "{:,.0f}"), ("power-offs", "power_offs", 1.0, "{:,.0f}"),
            ("wakes", "power_ons", 1.0, "{:,.0f}"), ("unplaced", "unplaced_jobs", 1.0, "{:,.0f}"))


def table(results: Mapping[str, Metrics]) -> str:
    """The markdown table, one row per run."""
    lines = ["| run | " + " | ".join(c[0] for c in _COLUMNS) + " |", "|---" * (len(_COLUMNS) + 1) + "|"]
    for name, m in results.items():
        lines.append(f"| {name} | " + " | ".join(f.format(float(m.get(k, 0.0)) * s) for _, k, s, f in _COLUMNS) + " |")
    return "\n".join(lines) + "\n"


def _lower(value: float, base: float) -> float:
    return (base - value) / base if base else 0.0


def floors(cluster: ClusterSnapshot, jobs: Sequence[JobRecord], threshold: float,
           mode: str = DEFAULT_THRESHOLD_MODE) -> dict[str, float]:
    """Lower bounds of active node-hours and energy that hold for every placement of these jobs.

    Every job's GPU-seconds must run somewhere, and a powered node of ``c`` GPUs carries at most
    ``f × c`` busy GPUs (the placement filter's cap: ``f`` is the GPU count's limit factor, the threshold
    in paper mode, 1 in whole-gpus mode). So node-hours ≥ GPU-hours / the largest such carry, and
    energy ≥ GPU-hours × the least ``idle / (f × c) + dynamic / c`` of any node
    (its idle power spread over as many busy GPUs as it may carry, plus a busy GPU's dynamic power).
    Booting, idle and spare nodes only add to both.

    :param cluster: the replayed nodes.
    :param jobs: one run's finished jobs (the work is the same in every run whose jobs all finished).
    :param threshold: the policies' threshold.
    :param mode: the policies' threshold mode.
    :returns: ``gpu_hours``, ``active_node_hours``, ``energy_kwh``.
    """
    gpu_hours = sum(j.gpus * (j.end_s - j.start_s) for j in jobs) / 3600.0
    gpu_nodes = [n for n in cluster.nodes if n.capacity.gpus > 0]
    if not gpu_nodes:
        return {"gpu_hours": gpu_hours, "active_node_hours": 0.0, "energy_kwh": 0.0}
    f = limit_factors(threshold, mode, shared=False)[0]
    carry = max(f * n.capacity.gpus for n in gpu_nodes)
    per_gpu_w = min(n.power.idle_w / (f * n.capacity.gpus) + (n.power.max_w - n.power.idle_w) / n.capacity.gpus
                    for n in gpu_nodes)
    return {"gpu_hours": gpu_hours, "active_node_hours": gpu_hours / carry,
            "energy_kwh": gpu_hours * per_gpu_w / 1000.0}


def goal_lines(results: Mapping[str, Metrics], floor: Mapping[str, float] | None = None) -> list[str]:
    """One line per goal (held / not held, with the measured change), and the mean JCT check.

    :param floor: :func:`floors`; a goal on one of its keys also says how far round-robin with
        power-down is from it (the most any policy could cut).
    """
    base = results[RR_PD]
    out = []
    for goal in GOALS:
        gains = {run: _lower(float(results[run][goal.key]), float(base[goal.key])) for run in goal.runs}
        held = any(g >= goal.gain for g in gains.values())
        measured = ", ".join(f"{run}: {g * 100:+.1f} %" for run, g in gains.items())
        line = f"- {goal.what} vs {RR_PD}: {'held' if held else 'not held'} (reduction {measured})"
        if floor is not None and goal.key in floor:
            room = _lower(floor[goal.key], float(base[goal.key]))
            line += (f"; the floor is {room * 100:.1f} % under {RR_PD}"
                     + (": out of reach of any placement" if room < goal.gain else ""))
        out.append(line)
    std_on = -_lower(float(results[ALG2_ON]["util_std"]), float(results[RR_ON]["util_std"]))
    out.append(f"- context: {ALG2_ON} vs {RR_ON}: utilization std-dev {std_on * 100:+.1f} %")
    for run in (ALG1, ALG2, ALG3, TIME, ALG1 + FIFO, ALG2 + FIFO, ALG3 + FIFO):
        worse = -_lower(float(results[run]["jct_mean_s"]), float(base["jct_mean_s"]))
        out.append(f"- {run}: mean JCT no worse than 1 % vs {RR_PD}: {'held' if worse <= 0.01 else 'not held'} "
                   f"({worse * 100:+.1f} %)")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Run the report; 0, or 2 when a trace is missing or malformed."""
    p = argparse.ArgumentParser(prog="python -m coordinator.simulator.adaptor_report",
                                description=__doc__.split("\n")[0])
    p.add_argument("--traces", type=Path, help=f"traces directory (default ${TRACES_ENV})")
    p.add_argument("--prefix", default="philly_", help="trace file prefix: PREFIXjobs.csv, PREFIXnodes.csv")
    p.add_argument("--nodes-limit", type=int, default=100, help="servers replayed (evenly spaced; default 100)")
    p.add_argument("--max-jobs", type=int, help="replay only the first N jobs by submission (a window)")
    p.add_argument("--power-down-after", type=float, default=600.0, metavar="SECONDS")
    p.add_argument("--wake-delay", type=float, default=120.0, metavar="SECONDS", help="boot time")
    p.add_argument("--spare-nodes", type=int, default=1)
    p.add_argument("--out", type=Path, help="also write report.md here")
    args = p.parse_args(argv)
    configure_logging("warning", stream=sys.stderr)
    try:
        traces = traces_dir(args.traces)
        setup = ReplaySetup(jobs=traces / f"{args.prefix}jobs.csv", nodes=traces / f"{args.prefix}nodes.csv",
                            nodes_limit=args.nodes_limit)
        cluster, jobs = load(setup)
        if args.max_jobs is not None:
            jobs = sorted(jobs, key=lambda j: (j.request.submit_s, j.request.task_id))[: max(0, args.max_jobs)]
        configs = [SimConfig(policy, power_down_after_s=args.power_down_after if adaptor else None,
                             wake_delay_s=args.wake_delay, spare_nodes=args.spare_nodes, keep_order=fifo,
                             keep_series=False)
                   for _, policy, adaptor, fifo in RUNS]
        runs = run_policies(cluster, jobs, configs, names=[name for name, *_ in RUNS],
                            progress=ProgressBar(sys.stderr))
    except (GptrmError, ValueError, OSError) as e:
        print(f"adaptor_report: {e}", file=sys.stderr)
        return 2
    results = {name: r.metrics for name, r in runs.items()}
    floor = (floors(cluster, runs[RR_PD].jobs, configs[0].threshold, configs[0].threshold_mode)
             if not results[RR_PD].get("unplaced_jobs") else None)
    floor_line = ([] if floor is None else [
        f"Floor for any placement ({floor['gpu_hours']:,.0f} GPU-hours of work on never-idle nodes): "
        f"{floor['energy_kwh']:,.1f} kWh, {floor['active_node_hours']:,.1f} active node-h", ""])
    body = [f"{len(jobs):,} jobs on {len(cluster.nodes)} nodes; power-down after {args.power_down_after:g} s, "
            f"boot {args.wake_delay:g} s, {args.spare_nodes} spare node(s)", "", table(results), *floor_line,
            *goal_lines(results, floor)]
    text = "\n".join(body) + "\n"
    sys.stdout.write(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "report.md").write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
