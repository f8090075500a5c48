"""The policy report: both real traces, every policy, plain and improved, in one markdown file.

``python -m coordinator.simulator.report --out DIR`` replays

* the Philly week (``philly_*.csv``) on 100 of its servers, and
* the Alibaba openb trace (``openb_*.csv``) on a 10-node subset, small enough that placement
  fails sometimes (see :data:`STUDIES` for why that subset),

each under the six policies twice: *plain* (every node always on, the paper's algorithms as
the engine runs them) and *improved* (:data:`IMPROVED`: idle nodes power down — the seed of
scale-in —, Alg. 1-2 get an elastic pool that scales out on their refusals, and each pass
decides in queue order). It writes ``DIR/report.md`` (tables, goal check, a reading generated
from the measured numbers) and, per study and variant, ``results.json``, ``results.md`` and
the plots. The traces are read where they lie (``--traces``, default ``$GPTRM_TRACES``), never copied.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from common.errors import GptrmError
from coordinator.simulator.cli import DEFAULT_POLICIES
from coordinator.simulator.engine import SimConfig
from coordinator.simulator.replay import (
    TIME_WEIGHTED_KEYS,
    ProgressBar,
    ReplaySetup,
    load,
    markdown_table,
    results_json,
    run_policies,
    write_outputs,
)
from coordinator.simulator.trace import TRACES_ENV, traces_dir

__all__ = ["IMPROVED", "OBJECTIVES", "STUDIES", "Objective", "Study", "goal_table", "main", "reading", "run_study"]

Metrics = Mapping[str, Any]
"""One run's metrics (a ``results.json`` entry)."""

IMPROVED = SimConfig(policy="", power_down_after_s=600.0, wake_delay_s=120.0, keep_order=True)
"""The improved variant's settings (the policy is filled in per run)."""
_BASELINE = "round-robin"


@dataclass(frozen=True, slots=True)
class Study:
    """One trace and cluster subset.

    :param key: directory name under ``--out``.
    :param title: heading.
    :param jobs: jobs file name in the traces directory.
    :param nodes: nodes file name.
    :param nodes_limit: nodes kept (evenly spaced in file order).
    :param why: why this subset, for the report.
    """

    key: str
    title: str
    jobs: str
    nodes: str
    nodes_limit: int
    why: str


STUDIES: tuple[Study, ...] = (
    Study("philly", "Philly week on 100 servers", "philly_jobs.csv", "philly_nodes.csv", 100,
          "100 of the 539 servers (every 5th-6th in file order); the week's load "
          "(≈ 13 % of all 3,205 GPUs on average) then saturates the subset for hours at a time."),
    Study("openb", "Alibaba openb on 10 nodes", "openb_jobs.csv", "openb_nodes.csv", 10,
          "10 of the 1,523 nodes (evenly spaced: 3 CPU-only, 3×8 G2, 1×8 V100-16GB, 2×2 T4, 1×2 P100; 38 GPUs). "
          "It is the largest evenly spaced subset on which every policy is refused sometimes: with 12 nodes "
          "max-utilization, power-efficient and first-fit never queue a job, with 15 or more hardly any "
          "policy does. Two 8-GPU pods asking for 120 cores fit no node of this subset and stay unplaced."),
)  # fmt: skip
"""The two replays of the report."""


@dataclass(frozen=True, slots=True)
class Objective:
    """A paper policy's own objective and the goal against round-robin.

    :param policy: the policy.
    :param label: algorithm label.
    :param key: the metric (lower is better for all three).
    :param goal: the relative improvement over round-robin the goal asks for.
    :param what: the metric in words.
    """

    policy: str
    label: str
    key: str
    goal: float
    what: str


OBJECTIVES: tuple[Objective, ...] = (
    Objective("max-utilization", "Alg. 1", "active_node_hours", 0.15, "active node-hours"),
    Objective("load-balancing", "Alg. 2", "util_std", 0.40, "utilization std-dev (Eq. 2)"),
    Objective("power-efficient", "Alg. 3", "energy_kwh", 0.20, "energy (Eq. 3)"),
)
"""Alg. 1-3's objectives, in the report's order."""


def _gain(value: float, base: float) -> float:
    """Relative improvement of a lower-is-better metric over a base (0.2 = 20 % lower)."""
    return (base - value) / base if base else 0.0


def _lower(gain: float) -> str:
    """A gain in words: ``12.3 % lower`` or ``4.0 % higher``."""
    return f"{abs(gain) * 100:.1f} % {'lower' if gain >= 0 else 'higher'}"


def _longer(value: float, base: float) -> str:
    """A completion time against a base: ``3.1 % longer`` or ``2.0 % shorter``."""
    change = (value - base) / base if base else 0.0
    return f"{abs(change) * 100:.1f} % {'longer' if change > 0 else 'shorter'}"


def run_study(study: Study, traces: Path, out: Path, *, plots: bool = True) -> dict[str, dict[str, Any]]:
    """Replay one study, plain and improved, and write its per-variant outputs.

    :param study: the study.
    :param traces: directory holding the trace files.
    :param out: the report directory (``out/<key>/plain``, ``out/<key>/improved`` are written).
    :param plots: draw the plots.
    :returns: ``"plain"``/``"improved"`` → policy → metrics.
    :raises TraceError: on a malformed trace file.
    """
    cluster, jobs = load(ReplaySetup(traces / study.jobs, traces / study.nodes, study.nodes_limit))
    gpus = sum(n.capacity.gpus for n in cluster.nodes)
    variants = {"plain": SimConfig(policy=""), "improved": IMPROVED}
    found: dict[str, dict[str, Any]] = {}
    for variant, template in variants.items():
        configs = [replace(template, policy=p, keep_series=plots) for p in DEFAULT_POLICIES]
        sys.stderr.write(f"{study.title}, {variant}:\n")
        results = run_policies(cluster, jobs, configs, progress=ProgressBar(sys.stderr))
        notes = [f"- {len(jobs):,} jobs on {len(cluster.nodes)} nodes ({gpus:g} GPUs); {_describe(template)}"]
        write_outputs(out / study.key / variant, results, title=f"{study.title}: {variant}", notes=notes, plots=plots)
        found[variant] = results_json(results)
    return found


def _describe(config: SimConfig) -> str:
    """The variant's settings in words."""
    if config.power_down_after_s is None:
        return (f"threshold {config.threshold:g} ({config.threshold_mode}), every node always on, paper order "
                "(Alg. 1-3 largest request first)")
    return (
        f"threshold {config.threshold:g} ({config.threshold_mode}), idle nodes off after "
        f"{config.power_down_after_s:g} s (wake-up {config.wake_delay_s:g} s), "
        f"Resource Adaptor with {config.spare_nodes} spare node(s), queue order in every pass {config.keep_order}"
    )


def goal_table(plain: Mapping[str, Metrics], improved: Mapping[str, Metrics], *, window: str = "") -> str:
    """The goal check: each paper policy's objective against round-robin, with the completion-time cost.

    :param plain: policy → metrics, plain variant.
    :param improved: policy → metrics, improved variant.
    :param window: ``""`` for the whole replay, ``"during_arrivals"`` for the nested window metrics.
    :returns: a markdown table.
    """

    def get(m: Metrics, key: str) -> float:
        return float((m[window] if window else m)[key])

    rr_p, rr_i = plain[_BASELINE], improved[_BASELINE]
    lines = [
        "| algorithm | objective | plain | plain vs RR | improved | improved vs RR plain | improved vs RR improved "
        "| goal | mean JCT plain vs RR | mean JCT improved vs RR plain |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for o in OBJECTIVES:
        p, i = plain[o.policy], improved[o.policy]
        vp, vi = get(p, o.key), get(i, o.key)
        lines.append(
            f"| {o.label} {o.policy} | {o.what} | {vp:,.3f} | {_lower(_gain(vp, get(rr_p, o.key)))} | {vi:,.3f} "
            f"| {_lower(_gain(vi, get(rr_p, o.key)))} | {_lower(_gain(vi, get(rr_i, o.key)))} "
            f"| ≥ {o.goal * 100:.0f} % lower | {_longer(p['jct_mean_s'], rr_p['jct_mean_s'])} "
            f"| {_longer(i['jct_mean_s'], rr_p['jct_mean_s'])} |"
        )
    return "\n".join(lines) + "\n"


def reading(plain: Mapping[str, Metrics], improved: Mapping[str, Metrics]) -> list[str]:
    """Sentences answering the report's questions, computed from the measured numbers.

    :param plain: policy → metrics, plain variant.
    :param improved: policy → metrics, improved variant.
    :returns: markdown bullet lines.
    """
    rr_p, rr_i = plain[_BASELINE], improved[_BASELINE]
    out = []
    for o in OBJECTIVES:
        p, i = plain[o.policy], improved[o.policy]
        g_plain, g_imp = _gain(p[o.key], rr_p[o.key]), _gain(i[o.key], rr_p[o.key])
        met_plain = g_plain >= o.goal and p["jct_mean_s"] <= rr_p["jct_mean_s"]
        met_imp = g_imp >= o.goal and i["jct_mean_s"] <= rr_p["jct_mean_s"]
        extra = ""
        if o.key == "active_node_hours":
            extra = (f" With every node always on, active node-hours cannot differ; busy node-hours are "
                     f"{_lower(_gain(p['busy_node_hours'], rr_p['busy_node_hours']))} than round-robin's.")
        out.append(
            f"- **{o.label} ({o.policy}), {o.what}:** plain {_lower(g_plain)} than round-robin, mean JCT "
            f"{_longer(p['jct_mean_s'], rr_p['jct_mean_s'])}. Improved: {_lower(g_imp)} than plain round-robin, "
            f"{_lower(_gain(i[o.key], rr_i[o.key]))} than round-robin with the same power-down; mean JCT "
            f"{_longer(i['jct_mean_s'], rr_p['jct_mean_s'])} than plain round-robin's "
            f"({_longer(i['jct_mean_s'], rr_i['jct_mean_s'])} than improved round-robin's). Mean queueing of "
            f"≥ 8-GPU jobs: {p['queue_delay_large_mean_s']:,.0f} s plain, {i['queue_delay_large_mean_s']:,.0f} s "
            f"improved, round-robin {rr_p['queue_delay_large_mean_s']:,.0f} s. Goal (≥ {o.goal * 100:.0f} % "
            f"without a longer mean JCT): plain {'met' if met_plain else 'not met'}, improved "
            f"{'met' if met_imp else 'not met'}.{extra}"
        )  # fmt: skip
    return out


def _section(study: Study, found: Mapping[str, Mapping[str, Metrics]]) -> list[str]:
    """The report section of one study."""
    plain, improved = found["plain"], found["improved"]
    rows = {**{p: m for p, m in plain.items()}, **{f"{p} (improved)": m for p, m in improved.items()}}
    window = {name: m["during_arrivals"] for name, m in rows.items()}
    plots = [f"![{v} {stem}]({study.key}/{v}/{stem}.png)" for v in ("plain", "improved")
             for stem in ("utilization", "power", "queue", "jct_cdf")]  # fmt: skip
    return [
        f"## {study.title}", "", f"Subset: {study.why}", "",
        f"Plain: {_describe(SimConfig(policy=''))}. Improved: {_describe(IMPROVED)}.", "",
        "### All policies (time-weighted over the whole replay, until the last job ends)", "",
        markdown_table(rows),
        "### Goal check against round-robin (whole replay)", "", goal_table(plain, improved),
        "### The same, time-weighted only until the last arrival (before the cluster drains)", "",
        goal_table(plain, improved, window="during_arrivals"), markdown_table(window, TIME_WEIGHTED_KEYS),
        "### Reading", "", *reading(plain, improved), "",
        "### Plots", "", *plots, "",
    ]  # fmt: skip


_CAVEATS = [
    "## How to read these numbers",
    "",
    "- Energy comes from the power model's datasheet curves, which are GPU board power only and linear in "
    "utilization (P100 30 → 250 W per GPU, V100 35 → 300 W, T4 10 → 70 W; openb's undisclosed G1-G3 models "
    "are guessed from the default 16 GiB memory as V100s; CPU-only nodes draw 0 W). With every node always on, "
    "the energy of a homogeneous cluster is then the same for every policy that finishes the same work: only "
    "power-down (or a cheaper GPU model, as on openb) can separate them.",
    "- Both traces keep running long after their last arrival (Philly: jobs of up to 25 days submitted in "
    "a 7-day window), so whole-replay averages are dominated by a mostly idle drain period; the "
    "'until the last arrival' tables show the loaded part alone.",
    "- 'Improved' changes how the simulator uses the policies, not the policies: nodes idle for the "
    "power-down time are switched off (they draw nothing) and need the wake-up time before work starts on "
    "them; only powered, ready nodes are schedulable and the adaptor wakes one for a job no ready node takes; "
    "each pass decides in queue order (the engine's keep_order).",
    "- JCT = completion − submission; queue delay = start − submission (including wake-up). 'waited' counts "
    "jobs that did not start at submission; 'unplaced' jobs never fit.",
]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the report.

    :param argv: arguments (default ``sys.argv[1:]``).
    :returns: exit code: 0, or 2 when a trace is missing or malformed.
    """
    parser = argparse.ArgumentParser(prog="python -m coordinator.simulator.report", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="report directory")
    parser.add_argument("--traces", type=Path, help=f"traces directory (default ${TRACES_ENV})")
    parser.add_argument("--studies", default=",".join(s.key for s in STUDIES), help="which studies to run")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    args = parser.parse_args(argv)
    wanted = [s for s in STUDIES if s.key in args.studies.split(",")]
    body = ["# Placement policies on real traces", ""]
    try:
        traces = traces_dir(args.traces)
        for study in wanted:
            body += _section(study, run_study(study, traces, args.out, plots=not args.no_plots))
    except (GptrmError, ValueError) as e:
        print(f"report: {e}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.md").write_text("\n".join(body + _CAVEATS) + "\n", encoding="utf-8")
    print(f"wrote {args.out / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
