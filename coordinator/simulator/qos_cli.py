"""``gptrmctl simulate --qos``: each policy replayed without and with preemption, per-class table out."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import replace

from common.errors import GptrmError, UsageError
from coordinator.domain import ClusterSnapshot
from coordinator.simulator.engine import SimConfig, SimJob
from coordinator.simulator.qos_report import qos_table
from coordinator.simulator.replay import ProgressBar, run_policies

__all__ = ["run_qos"]


def run_qos(args: argparse.Namespace, cluster: ClusterSnapshot, jobs: Sequence[SimJob],
            configs: Sequence[SimConfig]) -> None:
    """Replay, print the table on stdout and write it to ``<out>/qos.md``.

    :param args: the parsed ``simulate`` flags.
    :param cluster: the cluster.
    :param jobs: the jobs.
    :param configs: one per policy (preemption off; each also runs with it on).
    :raises UsageError: when a policy cannot be built.
    """
    both = [c for config in configs for c in (replace(config, keep_series=False),
                                                replace(config, keep_series=False, preemption=True))]
    names = [f"{c.policy}{' +preemption' if c.preemption else ''}" for c in both]
    try:
        results = run_policies(cluster, jobs, both, names=names, progress=ProgressBar(sys.stderr))
    except GptrmError as e:
        raise UsageError(str(e)) from e
    runs = {c.policy: (results[names[2 * n]], results[names[2 * n + 1]]) for n, c in enumerate(configs)}
    gpus = sum(n.capacity.gpus for n in cluster.nodes)
    note = (f"jobs: {args.jobs} ({len(jobs):,} replayed); nodes: {args.nodes}, {len(cluster.nodes)} nodes, "
            f"{gpus:g} GPUs{f' (limit {args.nodes_limit}, evenly spaced)' if args.nodes_limit else ''}; "
            f"threshold {args.threshold:g} ({args.threshold_mode})\n")
    table = qos_table(runs, jobs)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "qos.md").write_text(f"# Priorities and preemption\n\n{note}\n{table}", encoding="utf-8")
    sys.stdout.write(note + table)
    sys.stdout.write(f"wrote {args.out / 'qos.md'}\n")
