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

from coordinator.simulator.engine import SimConfig, SimJob, SimResult, Simulator
from coordinator.simulator.metrics import JobRecord, MetricsRecorder, Series
from coordinator.simulator.replay import ReplaySetup, load, run_policies, write_outputs
from coordinator.simulator.trace import TraceError, TraceJob, TraceNode, read_jobs, read_nodes, select_nodes
from coordinator.simulator.workload import NodeDefaults, build_cluster, build_jobs

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
