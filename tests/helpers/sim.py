"""Small builders for simulator tests: nodes with round power figures, jobs, trace files."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from coordinator.domain import ClusterSnapshot, NodeSnapshot, Request, Resources
from coordinator.simulator.engine import SimConfig, SimJob
from coordinator.simulator.synthetic import SyntheticSpec, generate
from coordinator.simulator.trace import write_jobs, write_nodes
from tests.helpers.builders import GIB, make_node

__all__ = ["GIB", "cluster", "job", "node", "synthetic_trace", "write_csv"]


def node(node_id: str, *, gpus: int = 4, idle_w: float = 100.0, max_w: float = 500.0) -> NodeSnapshot:
    """An idle node with 40 GiB GPUs and a round power curve (whole node: idle_w → max_w)."""
    return make_node(node_id, gpus=gpus, gpu_mem_gib=40, disk_gib=1000, gpu_model="TEST-GPU", idle_w=idle_w,
                     max_w=max_w)


def cluster(*nodes: NodeSnapshot) -> ClusterSnapshot:
    """The nodes in the given order."""
    return ClusterSnapshot(nodes=tuple(nodes))


def job(task_id: str, gpus: float, submit_s: float, duration_s: float, *, nodes: int = 1) -> SimJob:
    """A whole-GPU job (``gpus`` per node) with 1 core and 1 GiB per node."""
    demand = Resources(gpus=gpus, cpu_cores=1.0, mem_bytes=GIB)
    return SimJob(Request(task_id=task_id, demand=demand, nodes=nodes, submit_s=submit_s), duration_s)


def write_csv(path: Path, header: str, rows: Sequence[str]) -> Path:
    """Write a CSV file from a header line and row lines."""
    path.write_text("\n".join([header, *rows]) + "\n", encoding="utf-8")
    return path


def synthetic_trace(directory: Path, *, n_jobs: int = 200, n_nodes: int = 12, seed: int = 3,
                    prefix: str = "") -> tuple[Path, Path]:
    """A busy synthetic trace written as ``<prefix>jobs.csv`` and ``<prefix>nodes.csv``."""
    spec = SyntheticSpec(n_jobs=n_jobs, n_nodes=n_nodes, arrivals_per_hour=120.0, duration_median_s=1200.0,
                         llm_fraction=0.2)
    jobs, nodes = generate(spec, np.random.default_rng(seed))
    jobs_path, nodes_path = directory / f"{prefix}jobs.csv", directory / f"{prefix}nodes.csv"
    write_jobs(jobs_path, jobs)
    write_nodes(nodes_path, nodes)
    return jobs_path, nodes_path


def spy_on_runs(monkeypatch: pytest.MonkeyPatch, cli: ModuleType) -> list[SimConfig]:
    """The configurations a simulate front end (``cli``, a module that calls ``run_policies``) runs, collected as it
    runs them (each run still happens)."""
    configs: list[SimConfig] = []
    real = cli.run_policies

    def spy(cluster: Any, jobs: Any, cfgs: list[SimConfig], **kwargs: Any) -> Any:
        configs.extend(cfgs)
        return real(cluster, jobs, cfgs, **kwargs)

    monkeypatch.setattr(cli, "run_policies", spy)
    return configs
