"""``gptrmctl simulate --queues FILE|proportional``: the same trace three ways, per-queue report out.

The runs, all with the first policy of ``--policies`` and FIFO placement (``keep_order``, the
replay's first-come-first-served):

- ``fcfs`` — no queues (the plain replay);
- ``strict`` — the queue tree with every leaf's ``limit`` set to its quota: nobody borrows;
- ``borrow`` — the queue tree as given (``proportional``: lending everything, no limit), borrowing
  allowed, and reclaim preempting borrowers for queues owed their quota.

With ``--qos`` every run also has priority preemption (within a queue, as on the leader).

``--queues proportional`` generates the tree from the replayed jobs
(:func:`coordinator.simulator.queue_report.proportional_queues`); either way the tree used is
written to ``<out>/queues.toml``. The per-queue figures
(:func:`~coordinator.simulator.queue_report.queue_stats`; entitlements from the tree's quotas for all
three runs) are printed as a table and written to ``queues.json``, ``queues.csv`` and ``queues.md``,
beside ``results.json``/``results.md`` of the three runs. ``--records FILE`` writes each run's
per-job records to ``FILE`` with the run name before the suffix (``records-fcfs.csv``, ...).

Example (the Philly week on 100 servers)::

    gptrmctl simulate --jobs $GPTRM_TRACES/philly_jobs.csv --nodes $GPTRM_TRACES/philly_nodes.csv \
        --nodes-limit 100 --policies first-fit --queues proportional --records /tmp/q/records.csv \
        --no-plots --out /tmp/q
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from common.errors import GptrmError, UsageError
from coordinator.domain import ClusterSnapshot
from coordinator.queues import QueueConfig, dumps_toml, load_toml
from coordinator.simulator.engine import SimConfig, SimJob, SimResult
from coordinator.simulator.queue_report import proportional_queues, queue_stats, queue_table_rows, strict, write_records
from coordinator.simulator.replay import ProgressBar, run_policies, write_outputs

__all__ = ["PROPORTIONAL", "RUNS", "queue_configs", "records_path", "run_queues"]

PROPORTIONAL = "proportional"
"""``--queues`` value that generates the tree from the trace."""
RUNS = ("fcfs", "strict", "borrow")
"""The runs, in report order."""


def records_path(path: Path, run: str) -> Path:
    """``records.csv`` → ``records-<run>.csv``."""
    return path.with_name(f"{path.stem}-{run}{path.suffix or '.csv'}")


def queue_configs(source: str, jobs: Sequence[SimJob], cluster_gpus: int) -> QueueConfig:
    """The queue tree ``--queues`` names: a TOML file, or ``proportional``.

    :raises UsageError: the file cannot be read or is invalid.
    """
    if source == PROPORTIONAL:
        return proportional_queues(jobs, cluster_gpus)
    try:
        return load_toml(source)
    except GptrmError as e:
        raise UsageError(f"--queues: {e}") from e


def run_queues(args: argparse.Namespace, cluster: ClusterSnapshot, jobs: Sequence[SimJob],
               config: SimConfig) -> dict[str, SimResult]:
    """Replay the three runs, print the per-queue table and write the files (module docstring).

    :param args: the parsed ``simulate`` flags.
    :param cluster: the cluster.
    :param jobs: the jobs.
    :param config: the first policy's configuration (its queue fields are replaced).
    :returns: run name → result.
    :raises UsageError: when the queue file or a policy cannot be used.
    """
    gpus = int(sum(n.capacity.gpus for n in cluster.nodes))
    tree = queue_configs(args.queues, jobs, gpus)
    base = replace(config, keep_order=True, preemption=bool(getattr(args, "qos", False)))
    configs = [replace(base, queues=None), replace(base, queues=strict(tree), reclaim=False),
               replace(base, queues=tree, reclaim=True)]
    try:
        results = run_policies(cluster, jobs, configs, names=list(RUNS), progress=ProgressBar(sys.stderr))
    except GptrmError as e:
        raise UsageError(str(e)) from e
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    (out / "queues.toml").write_text(dumps_toml(tree), encoding="utf-8")
    stats = {run: queue_stats(results[run], jobs, tree, gpus) for run in RUNS}
    unknown = sorted({j.queue for j in jobs} - set(tree.leaves()))
    notes = [
        f"- jobs: `{args.jobs}` ({len(jobs):,} replayed); nodes: `{args.nodes}`, {len(cluster.nodes)} nodes, "
        f"{gpus:,} GPUs" + (f" (limit {args.nodes_limit}, evenly spaced)" if args.nodes_limit else ""),
        f"- policy {config.policy}, FIFO placement; queues: `{args.queues}` (written to queues.toml); "
        f"runs: fcfs (no queues), strict (limit = quota), borrow (borrowing and reclaim)"
        + ("; priority preemption in every run (--qos)" if base.preemption else ""),
        "- contended time: total demand (GPUs of running + pending jobs) above the cluster's GPUs; "
        "share = received / entitlement (min(quota, demand)) in that time; met = entitlement covered",
        "- the scheduler knows " + ("the trace's run times (--oracle)" if getattr(args, "oracle", False) else
                                    "what the leader knows: no job's run time"),
    ]
    if unknown:
        notes.append(f"- queues of jobs that the tree lacks (refused in strict and borrow): {', '.join(unknown)}")
    header, rows = queue_table_rows(stats)
    (out / "queues.json").write_text(json.dumps(stats, indent=2) + "\n", encoding="utf-8")
    with open(out / "queues.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["run", "queue", *next(iter(stats.values()))["queues"][next(iter(stats["fcfs"]["queues"]))]])
        for run, s in stats.items():
            for q, fig in s["queues"].items():
                w.writerow([run, q, *fig.values()])
    md = ["| " + " | ".join(header) + " |", "|---" * len(header) + "|", *("| " + " | ".join(r) + " |" for r in rows)]
    (out / "queues.md").write_text("# Team queues under contention\n\n" + "\n".join(notes) + "\n\n"
                                   + "\n".join(md) + "\n", encoding="utf-8")
    write_outputs(out, results, title="Trace replay with team queues", notes=notes, plots=not args.no_plots)
    if args.records is not None:
        for run in RUNS:
            write_records(records_path(args.records, run), results[run], jobs)
    _print_table(notes, header, rows)
    sys.stdout.write(f"wrote {out / 'queues.md'}, {out / 'queues.json'}, {out / 'queues.csv'}, "
                     f"{out / 'queues.toml'}, {out / 'results.json'}\n")
    return results


def _print_table(notes: Sequence[str], header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """The table on stdout (rich; plain text when stdout is not a terminal)."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(160, Console().width))
    for line in notes:
        console.print(line, markup=False, highlight=False)
    table = Table(title="Team queues under contention")
    for n, name in enumerate(header):
        table.add_column(name, justify="left" if n < 2 else "right")
    for row in rows:
        table.add_row(*row)
    console.print(table)
