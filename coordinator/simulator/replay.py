"""Load a trace, replay it under several policies, and write ``results.json``/``results.md``/plots.

This is what ``gptrmctl simulate`` and the report both run. The trace is read from where it
lies (``--jobs``/``--nodes``; nothing is copied).

Example::

    setup = ReplaySetup(jobs=Path("philly_jobs.csv"), nodes=Path("philly_nodes.csv"), nodes_limit=100)
    cluster, jobs = load(setup)
    results = run_policies(cluster, jobs, [SimConfig(p) for p in ("first-fit", "round-robin")])
    write_outputs(Path("out"), results, title="Philly week, 100 servers")
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from coordinator.domain import ClusterSnapshot
from coordinator.simulator.engine import SimConfig, SimJob, SimResult, Simulator
from coordinator.simulator.trace import read_jobs, read_nodes, select_nodes
from coordinator.simulator.workload import NodeDefaults, build_cluster, build_jobs

__all__ = [
    "REQUIRED_KEYS",
    "TIME_WEIGHTED_KEYS",
    "ProgressBar",
    "ReplaySetup",
    "load",
    "markdown_table",
    "results_json",
    "run_policies",
    "write_outputs",
]

REQUIRED_KEYS: tuple[str, ...] = (
    "util_mean", "util_std", "energy_kwh", "mean_power_w", "active_node_hours", "jct_mean_s", "jct_p50_s",
    "jct_p99_s", "queue_delay_mean_s", "makespan_s", "fragmentation", "unplaced_jobs",
)  # fmt: skip
"""Keys every policy's entry in ``results.json`` holds (more may follow)."""

# (header, metric key, scale, format) of the markdown table
_COLUMNS: tuple[tuple[str, str, float, str], ...] = (
    ("util mean (Eq. 1)", "util_mean", 1.0, "{:.3f}"),
    ("util std (Eq. 2)", "util_std", 1.0, "{:.3f}"),
    ("energy kWh (Eq. 3)", "energy_kwh", 1.0, "{:,.0f}"),
    ("kWh per job", "job_energy_mean_kwh", 1.0, "{:.2f}"),
    ("mean power kW", "mean_power_w", 1e-3, "{:.1f}"),
    ("active node-h", "active_node_hours", 1.0, "{:,.0f}"),
    ("busy node-h", "busy_node_hours", 1.0, "{:,.0f}"),
    ("JCT mean s", "jct_mean_s", 1.0, "{:,.0f}"),
    ("JCT p50 s", "jct_p50_s", 1.0, "{:,.0f}"),
    ("JCT p99 s", "jct_p99_s", 1.0, "{:,.0f}"),
    ("queue mean s", "queue_delay_mean_s", 1.0, "{:,.0f}"),
    ("queue ≥8-GPU jobs s", "queue_delay_large_mean_s", 1.0, "{:,.0f}"),
    ("makespan h", "makespan_s", 1 / 3600, "{:,.1f}"),
    ("frag.", "fragmentation", 1.0, "{:.3f}"),
    ("waited", "waited_jobs", 1.0, "{:,.0f}"),
    ("unplaced", "unplaced_jobs", 1.0, "{:,.0f}"),
)


@dataclass(frozen=True, slots=True)
class ReplaySetup:
    """Which trace and cluster to replay.

    :param jobs: jobs CSV.
    :param nodes: nodes CSV.
    :param nodes_limit: keep this many nodes (evenly spaced in file order), None for all.
    :param defaults: what nodes get where the trace is silent.
    :param include_never_ran: keep openb pods that never ran (``status=Pending``).
    """

    jobs: Path
    nodes: Path
    nodes_limit: int | None = None
    defaults: NodeDefaults = field(default_factory=NodeDefaults)
    include_never_ran: bool = False


def load(setup: ReplaySetup) -> tuple[ClusterSnapshot, list[SimJob]]:
    """Read and validate the trace, then build the cluster and the requests.

    :param setup: what to load.
    :returns: ``(cluster, jobs)``.
    :raises TraceError: on a malformed file (naming file, line and column).
    :raises ValueError: on a bad nodes limit.
    """
    nodes = select_nodes(read_nodes(setup.nodes), setup.nodes_limit)
    trace_jobs = read_jobs(setup.jobs, include_never_ran=setup.include_never_ran)
    cluster = build_cluster(nodes, setup.defaults)
    return cluster, build_jobs(trace_jobs, cluster)


class ProgressBar:
    """A one-line text progress bar on a stream (stderr): ``[#####.....]  50% label``.

    :param stream: where to draw (default stderr).
    :param width: bar characters.
    """

    def __init__(self, stream: TextIO | None = None, width: int = 30) -> None:
        self.stream = stream or sys.stderr
        self.width = width
        self._last = -1
        self.label = ""
        # Not a terminal (a log file, CI): a line every 10 % instead of redrawing one line.
        self.tty = self.stream.isatty()
        self.step = 1 if self.tty else 10

    def start(self, label: str) -> None:
        """Begin a new bar.

        :param label: what is running.
        """
        self.label = label
        self._last = -1
        self.update(0.0)

    def update(self, fraction: float) -> None:
        """Redraw when the whole percentage changed.

        :param fraction: done, 0..1.
        """
        percent = int(max(0.0, min(1.0, fraction)) * 100) // self.step * self.step
        if percent == self._last or (percent == 100 and not self.tty):
            return   # off a terminal, finish() writes the 100 % line, with its note
        self._last = percent
        self._draw(percent)
        if not self.tty:
            self.stream.write("\n")
        self.stream.flush()

    def _draw(self, percent: int) -> None:
        filled = percent * self.width // 100
        self.stream.write(f"{chr(13) if self.tty else ''}[{'#' * filled}{'.' * (self.width - filled)}] "
                          f"{percent:3d}% {self.label}")

    def finish(self, note: str = "") -> None:
        """End the line.

        :param note: appended after the bar (e.g. the wall time).
        """
        if self.tty:
            self.update(1.0)
        else:
            self._draw(100)
        self.stream.write(f" {note}\n")
        self.stream.flush()


def run_policies(
    cluster: ClusterSnapshot,
    jobs: Sequence[SimJob],
    configs: Sequence[SimConfig],
    *,
    names: Sequence[str] | None = None,
    progress: ProgressBar | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, SimResult]:
    """Replay the same jobs once per configuration.

    :param cluster: the cluster.
    :param jobs: the jobs.
    :param configs: one per run.
    :param names: the result keys (default: each config's policy name).
    :param progress: a bar to draw (None: quiet).
    :param clock: wall clock for the per-run time shown on the bar.
    :returns: ``name → result``, in the configs' order.
    """
    keys = list(names) if names is not None else [c.policy for c in configs]
    results: dict[str, SimResult] = {}
    for n, (key, config) in enumerate(zip(keys, configs, strict=True), start=1):
        started = clock()
        if progress is not None:
            progress.start(f"{key} ({n}/{len(configs)})")
        result = Simulator(cluster, jobs, config).run(progress.update if progress is not None else None)
        if progress is not None:
            progress.finish(f"{clock() - started:.1f}s, {result.events:,} events")
        results[key] = result
    return results


def results_json(results: Mapping[str, SimResult]) -> dict[str, dict[str, Any]]:
    """The ``results.json`` object: policy name → metrics (plus ``events``).

    :param results: the runs.
    :returns: a JSON-ready mapping.
    """
    return {name: {**r.metrics, "events": r.events} for name, r in results.items()}


TIME_WEIGHTED_KEYS: tuple[str, ...] = (
    "util_mean", "util_std", "energy_kwh", "mean_power_w", "active_node_hours", "busy_node_hours", "fragmentation",
)  # fmt: skip
"""The columns that are time-weighted (the only ones a time window changes)."""


def markdown_table(metrics: Mapping[str, Mapping[str, Any]], keys: Sequence[str] | None = None) -> str:
    """A markdown table with one row per run.

    :param metrics: run name → metrics.
    :param keys: the metric columns to show (default: all of them).
    :returns: the table (header, rule, rows), ending with a newline.
    """
    columns = [c for c in _COLUMNS if keys is None or c[1] in keys]
    lines = ["| policy | " + " | ".join(c[0] for c in columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for name, m in metrics.items():
        cells = [fmt.format(float(m.get(key, 0.0)) * scale) for _, key, scale, fmt in columns]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_outputs(
    out: Path, results: Mapping[str, SimResult], *, title: str, notes: Sequence[str] = (), plots: bool = True
) -> list[Path]:
    """Write ``results.json``, ``results.md`` and (optionally) the PNG plots into ``out``.

    :param out: the directory (created).
    :param results: the runs.
    :param title: heading of ``results.md``.
    :param notes: lines put under the heading (setup, subset, caveats).
    :param plots: also draw the plots.
    :returns: the files written.
    """
    out.mkdir(parents=True, exist_ok=True)
    data = results_json(results)
    written = [out / "results.json", out / "results.md"]
    written[0].write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    body = [f"# {title}", "", *notes, "", markdown_table(data)]
    if plots:
        from coordinator.simulator.plots import plot_all

        pngs = plot_all(out, results)
        written += pngs
        body += ["", *(f"![{p.stem}]({p.name})" for p in pngs)]
    written[1].write_text("\n".join(body) + "\n", encoding="utf-8")
    return written
