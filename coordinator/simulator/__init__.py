"""Trace-replay simulator: the coordinator's own profiler, queue order, policies and allocator in virtual time.

Modules: :mod:`~coordinator.simulator.trace` (CSV parsing and validation),
:mod:`~coordinator.simulator.synthetic` (generated traces), :mod:`~coordinator.simulator.workload`
(trace rows → cluster snapshot and profiled requests), :mod:`~coordinator.simulator.engine` (the
event loop), :mod:`~coordinator.simulator.metrics` (time-weighted Eq. 1-3, job statistics),
:mod:`~coordinator.simulator.replay` (runs and outputs), :mod:`~coordinator.simulator.plots`,
:mod:`~coordinator.simulator.cli` (``gptrmctl simulate``) and :mod:`~coordinator.simulator.report`.

Example::

    cluster, jobs = load(ReplaySetup(jobs=Path("jobs.csv"), nodes=Path("nodes.csv"), nodes_limit=100))
    result = Simulator(cluster, jobs, SimConfig("max-utilization", power_down_after_s=600)).run()
"""

from __future__ import annotations

import importlib
from typing import Any

# Names are resolved on first use (PEP 562), so that ``gptrmctl`` can register the ``simulate``
# subcommand from :mod:`coordinator.simulator.cli` without loading the engine and the scheduler.
_HOMES = {
    "SimConfig": "engine", "SimJob": "engine", "SimResult": "engine", "Simulator": "engine",
    "JobRecord": "metrics", "MetricsRecorder": "metrics", "Series": "metrics",
    "ReplaySetup": "replay", "load": "replay", "run_policies": "replay", "write_outputs": "replay",
    "TraceError": "trace", "TraceJob": "trace", "TraceNode": "trace", "read_jobs": "trace", "read_nodes": "trace",
    "select_nodes": "trace",
    "NodeDefaults": "workload", "build_cluster": "workload", "build_jobs": "workload",
}  # fmt: skip


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)


__all__ = [
    "JobRecord",
    "MetricsRecorder",
    "NodeDefaults",
    "ReplaySetup",
    "Series",
    "SimConfig",
    "SimJob",
    "SimResult",
    "Simulator",
    "TraceError",
    "TraceJob",
    "TraceNode",
    "build_cluster",
    "build_jobs",
    "load",
    "read_jobs",
    "read_nodes",
    "run_policies",
    "select_nodes",
    "write_outputs",
]
