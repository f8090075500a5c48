"""``gptrmctl simulate --elastic``: the same trace rigid and elastic, with and without power-down, in one run.

The runs, all with the first policy of ``--policies`` deciding in queue order (``keep_order``: the replay's
first-come-first-served), in report order (:data:`RUNS`):

- ``fcfs`` — every job rigid at its trace size (the baseline);
- ``fcfs-pd`` — the same with the Resource Adaptor powering idle nodes down (``--power-down-after``,
  600 s when not given);
- ``elastic`` — every whole-GPU job elastic (:mod:`coordinator.simulator.elastic`), maximum
  ``--elastic-max-factor`` × its trace GPUs (default 4, at most 64);
- ``elastic-pd`` — the same with power-down;
- ``elastic-x2`` — maximum 2 × its trace GPUs (left out when ``--elastic-max-factor`` is 2);
- ``shrink-only`` and ``grow-only`` — ``elastic`` with grows, or shrinks, not planned: what each part
  of the rules brings.

``--elastic-runs NAMES`` (comma-separated) replays only those runs. ``--queues FILE|proportional`` replays every
run with those team queues (borrowing and reclaim; :mod:`coordinator.simulator.queues_cli`), ``--qos`` with
priority preemption: the leader runs them together with elastic jobs, and so does the replay.

The allocator decides with what the leader would know (:mod:`coordinator.simulator.elastic`): throughput
readings with noise (``--throughput-noise``, default each model's measured spread), the profiler's run time per
model instead of the remaining run time, and the restart cost it measured; ``--oracle`` tells it the truth
instead, for comparison.

Each job's model, and so its true throughput curve, comes from its GPU-hours
(:mod:`coordinator.simulator.scaling`, data from ``--scaling``, default: the curves shipped in the package,
``coordinator/simulator/data/scaling``). The table
(mean, p50 and p99 JCT, makespan, GPU-hours allocated, energy, allocated over powered GPU-hours, grows
and shrinks per elastic job) is printed and written to ``report.md``, beside ``results.json`` and
``results.md`` of every run; ``--records FILE`` writes each run's per-job records
(:func:`coordinator.simulator.queue_report.write_records`, with the sizes an elastic job was resized to).

Example (the Philly week on 100 servers)::

    gptrmctl simulate --jobs $GPTRM_TRACES/philly_jobs.csv --nodes $GPTRM_TRACES/philly_nodes.csv \
        --nodes-limit 100 --policies first-fit --elastic --no-plots --out /tmp/elastic
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from common.errors import GptrmError, UsageError
from common.logging import configure_logging
from coordinator.domain import ClusterSnapshot
from coordinator.queues import QueueConfig
from coordinator.simulator.elastic import ElasticSimConfig, elastic_config
from coordinator.simulator.engine import SimConfig, SimJob, SimResult
from coordinator.simulator.replay import ProgressBar, run_policies, write_outputs
from coordinator.simulator.scaling import load_curves

__all__ = ["DEFAULT_POWER_DOWN_S", "RUNS", "elastic_configs", "report_rows", "run_elastic"]

DEFAULT_POWER_DOWN_S = 600.0
"""``--power-down-after`` of the power-down runs when the flag is not given."""
RUNS = ("fcfs", "fcfs-pd", "elastic", "elastic-pd", "elastic-x2", "shrink-only", "grow-only")
"""The runs, in report order."""

# (header, key in the row dict, format)
_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("JCT mean s", "jct_mean_s", "{:,.0f}"), ("JCT p50 s", "jct_p50_s", "{:,.0f}"),
    ("JCT p99 s", "jct_p99_s", "{:,.0f}"), ("makespan h", "makespan_h", "{:,.1f}"),
    ("GPU-h allocated", "allocated_gpu_hours", "{:,.0f}"), ("energy kWh", "energy_kwh", "{:,.0f}"),
    ("allocated / powered", "alloc_ratio", "{:.3f}"), ("grows / job", "grows_per_job", "{:.2f}"),
    ("shrinks / job", "shrinks_per_job", "{:.2f}"), ("unfinished", "unplaced_jobs", "{:,.0f}"),
)


def elastic_configs(base: SimConfig, elastic: ElasticSimConfig, power_down_s: float, max_factor: float, *,
                    queues: QueueConfig | None = None, preemption: bool = False) -> tuple[list[str], list[SimConfig]]:
    """The runs' names and configurations (module docstring).

    :param base: the first policy's configuration (power-down and elastic fields are replaced).
    :param elastic: the elastic configuration of the ``elastic`` run.
    :param power_down_s: power-down delay of the ``-pd`` runs.
    :param max_factor: the ``elastic`` run's factor (``elastic-x2`` is left out when it is 2).
    :param queues: team queues of every run (borrowing and reclaim; None: none).
    :param preemption: priority preemption in every run.
    """
    rigid = replace(base, keep_order=True, preemption=preemption, queues=queues, reclaim=True, elastic=None,
                    power_down_after_s=None)
    pd = replace(rigid, power_down_after_s=power_down_s)
    runs: list[tuple[str, SimConfig]] = [
        ("fcfs", rigid), ("fcfs-pd", pd), ("elastic", replace(rigid, elastic=elastic)),
        ("elastic-pd", replace(pd, elastic=elastic)),
    ]
    if max_factor != 2:
        runs.append(("elastic-x2", replace(rigid, elastic=replace(elastic, max_factor=2.0))))
    runs += [("shrink-only", replace(rigid, elastic=replace(elastic, grow=False))),
             ("grow-only", replace(rigid, elastic=replace(elastic, shrink=False)))]
    return [n for n, _ in runs], [c for _, c in runs]


def report_rows(results: Mapping[str, SimResult]) -> dict[str, dict[str, float]]:
    """Run name → the report's figures (module docstring)."""
    out: dict[str, dict[str, float]] = {}
    for name, r in results.items():
        m = r.metrics
        powered = float(m.get("powered_gpu_hours", 0.0))
        out[name] = {
            "jct_mean_s": float(m["jct_mean_s"]), "jct_p50_s": float(m["jct_p50_s"]),
            "jct_p99_s": float(m["jct_p99_s"]), "makespan_h": float(m["makespan_s"]) / 3600,
            "allocated_gpu_hours": float(m.get("allocated_gpu_hours", 0.0)), "energy_kwh": float(m["energy_kwh"]),
            "alloc_ratio": float(m.get("allocated_gpu_hours", 0.0)) / powered if powered > 0 else 0.0,
            "grows_per_job": float(m.get("grows_per_job", 0.0)),
            "shrinks_per_job": float(m.get("shrinks_per_job", 0.0)), "unplaced_jobs": float(m["unplaced_jobs"]),
        }
    return out


def _change(new: float, old: float) -> str:
    return f"{100 * (new - old) / old:+.1f} %" if old else "—"


def _verdict(rows: Mapping[str, Mapping[str, float]]) -> list[str]:
    """Elastic against static FCFS with the same power setting: mean JCT, makespan, energy."""
    lines = []
    for el, st in (("elastic", "fcfs"), ("elastic-pd", "fcfs-pd")):
        if el not in rows or st not in rows:
            continue
        a, b = rows[el], rows[st]
        lines.append(f"- {el} vs {st}: mean JCT {_change(a['jct_mean_s'], b['jct_mean_s'])}, "
                     f"makespan {_change(a['makespan_h'], b['makespan_h'])}, "
                     f"energy {_change(a['energy_kwh'], b['energy_kwh'])}")
    if {"elastic", "shrink-only", "grow-only", "fcfs"} <= rows.keys():
        base = rows["fcfs"]["jct_mean_s"]
        lines.append(f"- attribution (mean JCT vs fcfs): both {_change(rows['elastic']['jct_mean_s'], base)}, "
                     f"shrink only {_change(rows['shrink-only']['jct_mean_s'], base)}, "
                     f"grow only {_change(rows['grow-only']['jct_mean_s'], base)}")
    return lines


def _markdown(rows: Mapping[str, Mapping[str, float]]) -> list[str]:
    lines = ["| run | " + " | ".join(c[0] for c in _COLUMNS) + " |", "|---" * (len(_COLUMNS) + 1) + "|"]
    for name, row in rows.items():
        lines.append(f"| {name} | " + " | ".join(fmt.format(row[key]) for _, key, fmt in _COLUMNS) + " |")
    return lines


def run_elastic(args: argparse.Namespace, cluster: ClusterSnapshot, jobs: Sequence[SimJob],
                config: SimConfig) -> dict[str, SimResult]:
    """Replay the runs, print the table and write the files (module docstring).

    :param args: the parsed ``simulate`` flags.
    :param cluster: the cluster.
    :param jobs: the jobs.
    :param config: the first policy's configuration.
    :returns: run name → result.
    :raises UsageError: the scaling data cannot be read, or a flag is out of range.
    """
    # The power-down runs would bury the table under the adaptor's node-by-node log: warnings only, on stderr.
    configure_logging("warning", stream=sys.stderr)
    scaling: Path = args.scaling
    try:
        curves = load_curves(scaling)
    except (OSError, ValueError) as e:
        raise UsageError(f"--scaling: cannot read the scaling data under {scaling}: {e}") from e
    power_down = args.power_down_after if args.power_down_after is not None else DEFAULT_POWER_DOWN_S
    tree: QueueConfig | None = None
    if getattr(args, "queues", None) is not None:
        from coordinator.simulator.queues_cli import queue_configs

        tree = queue_configs(args.queues, jobs, int(sum(n.capacity.gpus for n in cluster.nodes)))
    try:
        elastic = elastic_config(jobs, curves, seed=args.seed, max_factor=args.elastic_max_factor,
                                 interval_s=args.elastic_interval, restart_cost_s=args.restart_cost,
                                 oracle=args.oracle, throughput_noise=args.throughput_noise)
        names, configs = elastic_configs(config, elastic, power_down, args.elastic_max_factor, queues=tree,
                                         preemption=bool(getattr(args, "qos", False)))
        if getattr(args, "elastic_runs", None):
            wanted = [n.strip() for n in args.elastic_runs.split(",") if n.strip()]
            unknown = sorted(set(wanted) - set(RUNS))
            if unknown:
                raise UsageError(f"--elastic-runs: unknown run(s) {', '.join(unknown)} (known: {', '.join(RUNS)})")
            kept = [(n, c) for n, c in zip(names, configs, strict=True) if n in wanted]
            names, configs = [n for n, _ in kept], [c for _, c in kept]
        results = run_policies(cluster, jobs, configs, names=names, progress=ProgressBar(sys.stderr))
    except (GptrmError, ValueError) as e:
        raise UsageError(str(e)) from e
    rows = report_rows(results)
    gpus = sum(n.capacity.gpus for n in cluster.nodes)
    models: dict[str, int] = {}
    for m in elastic.models:
        if m:
            models[m] = models.get(m, 0) + 1
    notes = [
        f"- jobs: `{args.jobs}` ({len(jobs):,} replayed, {sum(models.values()):,} elastic); nodes: `{args.nodes}`, "
        f"{len(cluster.nodes)} nodes, {gpus:,.0f} GPUs" + (f" (limit {args.nodes_limit}, evenly spaced)"
                                                          if args.nodes_limit else ""),
        f"- policy {config.policy}, FIFO placement; power-down after {power_down:g} s in the -pd runs (wake "
        f"{config.wake_delay_s:g} s, {config.spare_nodes} spare); elastic: 1..{args.elastic_max_factor:g} × trace "
        f"GPUs (at most 64), hysteresis {args.elastic_interval:g} s, restart cost {args.restart_cost:g} s",
        *([f"- every run with team queues `{args.queues}` (borrowing and reclaim)"] if tree is not None else []),
        *(["- every run with priority preemption (--qos)"] if getattr(args, "qos", False) else []),
        "- models by GPU-hours: " + ", ".join(f"{m} {n:,}" for m, n in sorted(models.items())),
        f"- throughput curves: measured training throughput read from `{scaling}` (source: its README)",
        "- the allocator knows " + ("the truth (--oracle): true throughput, remaining run time and restart cost"
                                    if args.oracle else
                                    "what the leader knows: throughput readings with noise "
                                    + (f"{args.throughput_noise:g}" if args.throughput_noise is not None else
                                       "by model (" + ", ".join(f"{m} {curves[m].noise:.3f}" for m in sorted(models))
                                       + ")")
                                    + ", the profiler's run time per model, measured restart cost"),
    ]
    table = _markdown(rows)
    verdict = _verdict(rows)
    out: Path = args.out
    write_outputs(out, results, title="Trace replay, rigid and elastic", notes=notes, plots=not args.no_plots)
    data: dict[str, Any] = {name: {**r.metrics, "events": r.events, "report": rows[name]}
                            for name, r in results.items()}
    (out / "results.json").write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    (out / "report.md").write_text("# Elastic jobs against static FCFS\n\n" + "\n".join(notes) + "\n\n"
                                   + "\n".join(table) + "\n\n" + "\n".join(verdict) + "\n", encoding="utf-8")
    if args.records is not None:
        from coordinator.simulator.queue_report import write_records
        from coordinator.simulator.queues_cli import records_path

        for name, result in results.items():
            write_records(records_path(args.records, name), result, jobs)
    for line in [*notes, "", *table, "", *verdict]:
        sys.stdout.write(line + "\n")
    sys.stdout.write(f"wrote {out / 'report.md'}, {out / 'results.json'}, {out / 'results.md'}\n")
    return results
