"""``gptrmctl simulate``: replay a job trace under several policies and write the results.

gptrmctl registers the subcommand with :func:`add_simulate_parser`; the same flags run as
``python -m coordinator.simulator``. Usage and input errors (unknown policy, malformed trace,
bad numbers) raise :class:`common.errors.UsageError`, which gptrmctl reports with exit code 2.
This module imports the simulator itself only when a replay runs, so that building gptrmctl's
parser stays cheap.

Example::

    gptrmctl simulate --jobs $GPTRM_TRACES/philly_jobs.csv --nodes $GPTRM_TRACES/philly_nodes.csv \\
        --nodes-limit 100 --policies max-utilization,round-robin --power-down-after 600 --out /tmp/sim

With ``--queues FILE|proportional`` the first policy is replayed three times — FCFS without queues,
strict quotas, quotas with borrowing and reclaim — and a per-queue report under contention is
written (:mod:`coordinator.simulator.queues_cli`). With ``--elastic`` it is replayed rigid and with
elastic jobs, with and without power-down (:mod:`coordinator.simulator.elastic_cli`). ``--records FILE``
writes per-job records, one file per run (:func:`coordinator.simulator.queue_report.write_records`).
Both decide with what the leader would know (:func:`coordinator.simulator.workload.without_run_estimates`, and
for elastic jobs :mod:`coordinator.simulator.elastic`); ``--oracle`` gives them the truth, for comparison.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common.errors import GptrmError, UsageError
from common.types import DEFAULT_THRESHOLD, DEFAULT_THRESHOLD_MODE, THRESHOLD_MODES
from coordinator.simulator.node_defaults import NodeDefaults

if TYPE_CHECKING:
    from coordinator.simulator.engine import SimConfig

__all__ = ["DEFAULT_POLICIES", "add_simulate_arguments", "add_simulate_parser", "main", "run_simulate"]

DEFAULT_POLICIES = ("max-utilization", "load-balancing", "power-efficient", "round-robin", "random", "first-fit")
"""The three paper policies and the three baselines, in report order."""
_LAST_SUBMIT = "last-submit"


def add_simulate_arguments(p: argparse.ArgumentParser) -> None:
    """Add the ``simulate`` flags to a parser.

    :param p: the parser.
    """
    d = NodeDefaults()
    p.add_argument("--jobs", required=True, type=Path, help="jobs CSV (schema: docs/simulator.md, Traces)")
    p.add_argument("--nodes", required=True, type=Path, help="nodes CSV")
    p.add_argument("--nodes-limit", type=int, help="replay on N nodes, evenly spaced in file order")
    p.add_argument("--policies", default=",".join(DEFAULT_POLICIES), help="comma-separated policy names")
    p.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD,
                   help=f"cap on the capped dimensions' utilization after placement (default {DEFAULT_THRESHOLD:g}, "
                        "the coordinator's)")
    p.add_argument("--threshold-mode", choices=THRESHOLD_MODES, default=DEFAULT_THRESHOLD_MODE,
                   help="whole-gpus (default, the coordinator's): the threshold caps host CPU, memory, disk and shared "
                        "GPUs, whole GPUs may fill a node; paper: it caps every dimension, GPU count included")
    p.add_argument("--power-down-after", type=float, metavar="SECONDS",
                   help="run the Resource Adaptor: power nodes idle this long down, wake them for waiting jobs")
    p.add_argument("--spare-nodes", type=int, default=1, metavar="N",
                   help="idle nodes the adaptor keeps on (default 1)")
    p.add_argument("--wake-delay", type=float, default=120.0, metavar="SECONDS",
                   help="boot time of a powered-down node, power-on to ready (default 120)")
    p.add_argument("--keep-order", action="store_true", help="decide in queue order also for Alg. 1-3 (FIFO)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random policy")
    p.add_argument("--measure-until", metavar="SECONDS|last-submit",
                   help="stop the time-weighted metrics here (default: the last event)")
    p.add_argument("--include-never-ran", action="store_true", help="keep openb pods with status Pending")
    p.add_argument("--default-gpu-model", default=d.gpu_model, help="GPU model of nodes the trace does not name")
    p.add_argument("--default-gpu-mem-gib", type=float, default=d.gpu_mem_gib, help="GPU memory where unknown")
    p.add_argument("--default-cpu-per-gpu", type=float, default=d.cpu_cores_per_gpu, help="host cores per GPU")
    p.add_argument("--default-mem-gib-per-gpu", type=float, default=d.mem_gib_per_gpu, help="host GiB per GPU")
    p.add_argument("--host-idle-w", type=float, default=d.host_idle_w,
                   help="constant host power per powered node added to the GPU power curve (default 0)")
    p.add_argument("--exact-batches", action="store_true", help="reference mode: place_batch over the whole queue")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--qos", action="store_true",
                   help="replay each policy without and with preemption; print per-priority-class queueing delay "
                   "and what preemption costs the low class (writes qos.md); with --queues or --elastic: "
                   "preemption in every run of that report instead")
    p.add_argument("--queues", metavar="FILE|proportional",
                   help="team queues (TOML file, or 'proportional': one queue per trace group, quota by its "
                        "GPU-hours): replay the first policy FCFS without queues, with strict quotas, and with "
                        "borrowing and reclaim; per-queue table under contention (writes queues.md/json/csv/toml); "
                        "with --elastic: every elastic report run with these queues, borrowing and reclaim")
    p.add_argument("--elastic", action="store_true",
                   help="replay the first policy in FIFO order rigid and elastic (jobs resized by the elastic "
                        "allocator's rules), with and without power-down (default 600 s), at --elastic-max-factor "
                        "and at 2, and with only shrinks or only grows; writes report.md")
    p.add_argument("--elastic-max-factor", type=float, default=4.0, metavar="F",
                   help="with --elastic: a job's maximum is F × its trace GPUs, at most 64 (default 4)")
    p.add_argument("--elastic-interval", type=float, default=300.0, metavar="SECONDS",
                   help="with --elastic: a job resizes at most once per this long (default 300)")
    p.add_argument("--restart-cost", type=float, default=30.0, metavar="SECONDS",
                   help="with --elastic: what a resize costs a job, GPUs held without progress (default 30)")
    p.add_argument("--throughput-noise", type=float, default=None, metavar="X",
                   help="with --elastic: relative standard deviation of a throughput reading the allocator learns "
                        "from (default: each model's measured spread)")
    p.add_argument("--oracle", action="store_true",
                   help="with --elastic or --queues: decide with the truth (with --elastic the true throughput, "
                        "remaining run time and restart cost; a job's run time is the trace's) instead of what the "
                        "leader would know (for comparison)")
    p.add_argument("--elastic-runs", metavar="NAMES",
                   help="with --elastic: replay only these runs, comma-separated (fcfs, fcfs-pd, elastic, elastic-pd, "
                        "elastic-x2, shrink-only, grow-only; default all)")
    p.add_argument("--scaling", type=Path, default=None, metavar="DIR",
                   help="with --elastic: measured scaling curves (pollux/<model>/...; default: the packaged ones)")
    p.add_argument("--records", type=Path, metavar="FILE",
                   help="per-job records CSV (job_id,queue,submit_s,start_s,end_s,gpus,nodes,resizes), one file "
                        "per run: the run or policy name goes before the suffix (records-fcfs.csv)")
    p.add_argument("--out", required=True, type=Path, help="output directory")


def add_simulate_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``simulate`` on gptrmctl's subparsers.

    :param subparsers: what ``ArgumentParser.add_subparsers()`` returned.
    :returns: the new subparser.
    """
    sp: argparse.ArgumentParser = subparsers.add_parser("simulate", help="replay a job trace under several policies")
    add_simulate_arguments(sp)
    sp.set_defaults(fn=run_simulate)
    return sp


def _have_matplotlib() -> bool:
    """Whether the plots can be drawn (matplotlib comes with the ``sim`` extra)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _usage(message: str) -> UsageError:
    """A usage/input error (exit code 2)."""
    return UsageError(message)


def _policies(text: str) -> list[str]:
    """Parse and check the policy list."""
    from coordinator.scheduler.policies import POLICIES

    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in POLICIES]
    if not names or unknown:
        raise _usage(f"--policies: unknown {', '.join(unknown) or '(empty)'} (known: {', '.join(sorted(POLICIES))})")
    return names


def _configs(args: argparse.Namespace, names: Sequence[str], last_submit_s: float) -> list[SimConfig]:
    """One replay configuration per policy, from the flags."""
    from coordinator.simulator.engine import SimConfig

    until: float | None = None
    if args.measure_until == _LAST_SUBMIT:
        until = last_submit_s
    elif args.measure_until is not None:
        try:
            until = float(args.measure_until)
        except ValueError:
            raise _usage(f"--measure-until: expected seconds or {_LAST_SUBMIT}, got {args.measure_until!r}") from None
    try:
        return [
            SimConfig(
                policy=name, threshold=args.threshold, threshold_mode=args.threshold_mode, seed=args.seed,
                power_down_after_s=args.power_down_after,
                wake_delay_s=args.wake_delay, spare_nodes=args.spare_nodes, keep_order=args.keep_order,
                exact_batches=args.exact_batches, measure_until_s=until, keep_series=not args.no_plots,
            )
            for name in names
        ]
    except ValueError as e:
        raise _usage(str(e)) from e


def run_simulate(transport: object, args: argparse.Namespace) -> None:
    """Run ``simulate`` (the transport is not used: nothing talks to a coordinator).

    :param transport: ignored.
    :param args: parsed flags.
    :raises UsageError: on usage or input errors (exit code 2).
    """
    from coordinator.simulator.replay import (
        ProgressBar,
        ReplaySetup,
        load,
        markdown_table,
        results_json,
        run_policies,
        write_outputs,
    )
    names = _policies(args.policies)
    if not args.no_plots and not _have_matplotlib():
        # Everything but the PNGs works without the [sim] extra; say so once and carry on.
        print("gptrmctl simulate: plots skipped: matplotlib is not installed (pip install 'gptrm[sim]')",
              file=sys.stderr)
        args.no_plots = True
    if args.nodes_limit is not None and args.nodes_limit < 1:
        raise _usage(f"--nodes-limit must be ≥ 1, got {args.nodes_limit}")
    try:
        defaults = NodeDefaults(
            gpu_model=args.default_gpu_model, gpu_mem_gib=args.default_gpu_mem_gib,
            cpu_cores_per_gpu=args.default_cpu_per_gpu, mem_gib_per_gpu=args.default_mem_gib_per_gpu,
            host_idle_w=args.host_idle_w,
        )  # fmt: skip
        setup = ReplaySetup(args.jobs, args.nodes, args.nodes_limit, defaults, args.include_never_ran)
        cluster, jobs = load(setup)
    except (GptrmError, ValueError) as e:
        raise _usage(str(e)) from e
    if not jobs:
        raise _usage(f"{args.jobs}: no jobs to replay")
    configs = _configs(args, names, max(j.request.submit_s for j in jobs))
    if (args.elastic or args.queues is not None) and not args.oracle:
        from coordinator.simulator.workload import without_run_estimates

        jobs = without_run_estimates(jobs)   # the leader's information only (--oracle: the trace's durations)
    if args.elastic:   # with --queues and --qos: every run with the team queues and preemption, as the leader
        from coordinator.simulator.elastic_cli import run_elastic
        from coordinator.simulator.scaling import default_scaling_dir

        if args.scaling is None:
            args.scaling = default_scaling_dir()
        run_elastic(args, cluster, jobs, configs[0])
        return
    if args.queues is not None:   # with --qos: every run with preemption
        from coordinator.simulator.queues_cli import run_queues

        run_queues(args, cluster, jobs, configs[0])
        return
    if args.qos:
        from coordinator.simulator.qos_cli import run_qos

        run_qos(args, cluster, jobs, configs)
        return
    try:
        results = run_policies(cluster, jobs, configs, progress=ProgressBar(sys.stderr))
    except GptrmError as e:  # a bad threshold or seed surfaces when the policy is built
        raise _usage(str(e)) from e
    gpus = sum(n.capacity.gpus for n in cluster.nodes)
    notes = [
        f"- jobs: `{args.jobs}` ({len(jobs):,} replayed); nodes: `{args.nodes}`, {len(cluster.nodes)} nodes, "
        f"{gpus:g} GPUs" + (f" (limit {args.nodes_limit}, evenly spaced)" if args.nodes_limit else ""),
        f"- threshold {args.threshold:g} ({args.threshold_mode}); power-down after {args.power_down_after}s; "
        f"wake delay {args.wake_delay:g}s; "
        f"spare nodes {args.spare_nodes}; keep order {args.keep_order}; seed {args.seed}",
    ]
    write_outputs(args.out, results, title="Trace replay", notes=notes, plots=not args.no_plots)
    if args.records is not None:
        from coordinator.simulator.queue_report import write_records
        from coordinator.simulator.queues_cli import records_path

        for name, result in results.items():
            write_records(records_path(args.records, name), result, jobs)
    sys.stdout.write(markdown_table(results_json(results)))
    sys.stdout.write(f"wrote {args.out / 'results.json'}, {args.out / 'results.md'}\n")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m coordinator.simulator``: the ``simulate`` flags without gptrmctl.

    :param argv: arguments (default ``sys.argv[1:]``).
    :returns: the exit code (0, or 2 on usage/input errors).
    """
    parser = argparse.ArgumentParser(prog="python -m coordinator.simulator", description="Replay a job trace.")
    add_simulate_arguments(parser)
    parser.set_defaults(fn=run_simulate)
    try:
        args = parser.parse_args(argv)
        args.fn(None, args)
    except UsageError as e:
        print(f"simulate: {e}", file=sys.stderr)
        return 2
    except SystemExit as e:  # --help, argparse usage errors
        return int(e.code or 0)
    return 0
