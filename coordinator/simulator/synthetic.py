"""Synthetic traces in the replay schema: for tests, and for scales beyond the real traces.

Jobs arrive as a Poisson process (optionally with a day/night swing), ask for a GPU count drawn
from a discrete distribution (counts above a node's width become gangs), and run for a
log-normal time. A fraction of them are LLM tasks (training, fine-tuning, inference) with a
model size: those rows carry ``kind`` and ``params_b``, and the replay asks the profiler for
their demand. Every draw comes from the injected ``numpy.random.Generator``.

Also a command: ``python -m coordinator.simulator.synthetic --n-jobs 100000 --n-nodes 2000 --out DIR``
writes ``DIR/jobs.csv`` and ``DIR/nodes.csv`` for ``gptrmctl simulate``.

Example::

    jobs, nodes = generate(SyntheticSpec(n_jobs=5000, n_nodes=400), np.random.default_rng(7))
    write_jobs(out / "jobs.csv", jobs)
    write_nodes(out / "nodes.csv", nodes)
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import numpy as np

from common.types import TaskKind
from coordinator.domain import ModelSpecData, TaskSpecData
from coordinator.profiler.profiler import Profiler
from coordinator.simulator.trace import TraceJob, TraceNode, write_jobs, write_nodes

__all__ = ["SyntheticSpec", "generate", "generate_jobs", "generate_nodes", "llm_gpus", "main"]

_DAY_S = 86_400.0


def _check_weights(name: str, weights: Mapping[object, float]) -> None:
    """Refuse an empty or negative distribution."""
    if not weights or any(w < 0 for w in weights.values()) or sum(weights.values()) <= 0:
        raise ValueError(f"{name}: weights must be non-negative with a positive sum, got {dict(weights)!r}")


@dataclass(frozen=True, slots=True)
class SyntheticSpec:
    """What to generate.

    :param n_jobs: number of jobs.
    :param n_nodes: number of nodes.
    :param arrivals_per_hour: mean arrival rate.
    :param diurnal_amplitude: relative day/night swing of the rate, 0 (flat) .. < 1.
    :param gpu_counts: GPUs per job → weight (0: CPU-only; above ``node_gpus`` max: a gang).
    :param duration_median_s: median run time.
    :param duration_sigma: log-normal shape (σ of ``ln(duration)``).
    :param duration_max_s: longest run time (longer draws are clipped).
    :param llm_fraction: share of jobs that are LLM tasks profiled from a model spec (their GPU
        count is the profiler's, not a draw from ``gpu_counts``).
    :param llm_kinds: LLM task kind → weight.
    :param llm_params_b: model size in billions of parameters → weight.
    :param node_gpus: GPUs per node → weight.
    :param gpu_model: GPU model of every GPU node.
    :param gpu_mem_gib: memory per GPU.
    :param cpu_cores_per_gpu: host cores per GPU (per node for CPU-only nodes: × 8).
    :param mem_gib_per_gpu: host memory per GPU.
    """

    n_jobs: int = 1000
    n_nodes: int = 100
    arrivals_per_hour: float = 60.0
    diurnal_amplitude: float = 0.0
    gpu_counts: Mapping[int, float] = field(default_factory=lambda: {1: 0.6, 2: 0.15, 4: 0.1, 8: 0.12, 16: 0.03})
    duration_median_s: float = 1800.0
    duration_sigma: float = 1.2
    duration_max_s: float = 7 * _DAY_S
    llm_fraction: float = 0.0
    llm_kinds: Mapping[str, float] = field(
        default_factory=lambda: {"training": 0.3, "fine-tuning": 0.3, "inference": 0.4}
    )
    llm_params_b: Mapping[float, float] = field(default_factory=lambda: {1.3: 0.2, 7.0: 0.4, 13.0: 0.3, 70.0: 0.1})
    node_gpus: Mapping[int, float] = field(default_factory=lambda: {8: 0.6, 4: 0.4})
    gpu_model: str = "NVIDIA A100-SXM4-80GB"
    gpu_mem_gib: float = 80.0
    cpu_cores_per_gpu: float = 8.0
    mem_gib_per_gpu: float = 64.0

    def __post_init__(self) -> None:
        if self.n_jobs < 0 or self.n_nodes < 1:
            raise ValueError(f"need n_jobs ≥ 0 and n_nodes ≥ 1, got {self.n_jobs}, {self.n_nodes}")
        if self.arrivals_per_hour <= 0 or not 0 <= self.diurnal_amplitude < 1:
            raise ValueError("arrivals_per_hour must be > 0 and diurnal_amplitude in [0, 1)")
        if self.duration_median_s <= 0 or self.duration_sigma < 0 or self.duration_max_s <= 0:
            raise ValueError("durations: median and max must be > 0, sigma ≥ 0")
        if not 0 <= self.llm_fraction <= 1:
            raise ValueError(f"llm_fraction must be in [0, 1], got {self.llm_fraction}")
        for name in ("gpu_counts", "llm_kinds", "llm_params_b", "node_gpus"):
            _check_weights(name, getattr(self, name))


K = TypeVar("K")


def _choice(rng: np.random.Generator, weights: Mapping[K, float], size: int) -> list[K]:
    """``size`` draws from a weighted discrete distribution (keys in the mapping's order)."""
    keys = list(weights)
    p = np.array([weights[k] for k in keys], dtype=np.float64)
    picks = rng.choice(len(keys), size=size, p=p / p.sum())
    return [keys[int(i)] for i in picks]


def _arrivals(spec: SyntheticSpec, rng: np.random.Generator) -> np.ndarray:
    """Arrival times of a (possibly day/night modulated) Poisson process, by thinning."""
    peak = spec.arrivals_per_hour * (1.0 + spec.diurnal_amplitude) / 3600.0
    times: list[float] = []
    t = 0.0
    while len(times) < spec.n_jobs:
        gaps = rng.exponential(1.0 / peak, size=max(64, spec.n_jobs - len(times)))
        accept = rng.random(size=len(gaps))
        for gap, u in zip(gaps.tolist(), accept.tolist(), strict=True):
            t += gap
            rate = 1.0 + spec.diurnal_amplitude * math.sin(2 * math.pi * t / _DAY_S)
            if u * (1.0 + spec.diurnal_amplitude) <= rate:
                times.append(round(t, 3))
                if len(times) == spec.n_jobs:
                    break
    return np.array(times, dtype=np.float64)


def llm_gpus(profiler: Profiler, kind: str, params_b: float, width: int) -> tuple[int, float]:
    """The GPUs the profiler gives an LLM task (a gang over ``ceil(count / width)`` nodes when wider).

    :param profiler: the profiler (its GPU memory is the target GPU's).
    :param kind: ``training``, ``fine-tuning`` or ``inference``.
    :param params_b: model size in billions of parameters.
    :param width: GPUs of the widest node.
    :returns: ``(gpus, gpu_share)`` for the trace row (share < 1 only for a shared inference GPU).
    """
    task_kind = TaskKind.parse(kind)
    model = ModelSpecData(name=f"llm-{params_b:g}b", params_billions=params_b)
    sharing = task_kind == TaskKind.INFERENCE
    demand = profiler.profile(TaskSpecData(kind=task_kind, model=model, allow_gpu_sharing=sharing)).demand
    if demand.gpus < 1:
        return 1, demand.gpus
    if demand.gpus <= width:
        return int(demand.gpus), 1.0
    nodes = math.ceil(demand.gpus / width)
    per_node = profiler.profile(TaskSpecData(kind=task_kind, model=model, nodes=nodes)).demand.gpus
    return int(per_node) * nodes, 1.0


def generate_jobs(spec: SyntheticSpec, rng: np.random.Generator) -> list[TraceJob]:
    """Jobs only, sorted by submission time.

    :param spec: what to generate.
    :param rng: the random generator.
    :returns: ``spec.n_jobs`` jobs with ids ``syn-000000`` …
    """
    n = spec.n_jobs
    submit = _arrivals(spec, rng)
    durations = np.minimum(rng.lognormal(math.log(spec.duration_median_s), spec.duration_sigma, n), spec.duration_max_s)
    gpus = _choice(rng, spec.gpu_counts, n)
    is_llm = rng.random(n) < spec.llm_fraction
    kinds = _choice(rng, spec.llm_kinds, n)
    sizes = _choice(rng, spec.llm_params_b, n)
    profiler = Profiler(gpu_model_mem_bytes=int(spec.gpu_mem_gib * 1024**3))
    width = max(spec.node_gpus)
    jobs = []
    for k in range(n):
        count, share = int(gpus[k]), 1.0
        kind, params = (str(kinds[k]), float(sizes[k])) if is_llm[k] else ("", 0.0)
        if kind:
            # The row's GPU count is what the profiler will ask for; the replay profiles the spec again.
            count, share = llm_gpus(profiler, kind, params, width)
        jobs.append(TraceJob(
            job_id=f"syn-{k:06d}",
            submit_s=float(submit[k]),
            duration_s=round(max(float(durations[k]), 1.0), 3),
            gpus=count,
            gpu_share=share if count > 0 else 0.0,
            cpu_cores=None if kind else 4.0 * max(count, 1),
            mem_gib=None if kind else 32.0 * max(count, 1),
            group="synthetic",
            kind=kind,
            params_b=params,
        ))  # fmt: skip
    return jobs


def generate_nodes(spec: SyntheticSpec, rng: np.random.Generator) -> list[TraceNode]:
    """Nodes only.

    :param spec: what to generate.
    :param rng: the random generator.
    :returns: ``spec.n_nodes`` nodes with ids ``syn-node-0000`` …
    """
    nodes = []
    for k, count in enumerate(_choice(rng, spec.node_gpus, spec.n_nodes)):
        gpus = int(count)
        width = max(gpus, 1)
        nodes.append(TraceNode(
            node_id=f"syn-node-{k:04d}",
            gpus=gpus,
            gpu_model=spec.gpu_model if gpus else "",
            gpu_mem_gib=spec.gpu_mem_gib if gpus else None,
            cpu_cores=spec.cpu_cores_per_gpu * (width if gpus else 8),
            mem_gib=spec.mem_gib_per_gpu * (width if gpus else 8),
        ))
    return nodes


def generate(spec: SyntheticSpec, rng: np.random.Generator) -> tuple[list[TraceJob], list[TraceNode]]:
    """A whole synthetic trace.

    :param spec: what to generate.
    :param rng: the random generator (nodes are drawn after jobs).
    :returns: ``(jobs, nodes)``.
    """
    jobs = generate_jobs(spec, rng)
    return jobs, generate_nodes(spec, rng)


def main(argv: Sequence[str] | None = None) -> int:
    """Write a synthetic trace (``jobs.csv``, ``nodes.csv``) into ``--out``.

    :param argv: arguments (default ``sys.argv[1:]``).
    :returns: 0, or 2 on a bad argument.
    """
    p = argparse.ArgumentParser(prog="python -m coordinator.simulator.synthetic", description="Write a trace.")
    d = SyntheticSpec()
    p.add_argument("--n-jobs", type=int, default=d.n_jobs)
    p.add_argument("--n-nodes", type=int, default=d.n_nodes)
    p.add_argument("--arrivals-per-hour", type=float, default=d.arrivals_per_hour)
    p.add_argument("--diurnal-amplitude", type=float, default=d.diurnal_amplitude)
    p.add_argument("--duration-median-s", type=float, default=d.duration_median_s)
    p.add_argument("--llm-fraction", type=float, default=d.llm_fraction)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    try:
        spec = SyntheticSpec(
            n_jobs=args.n_jobs, n_nodes=args.n_nodes, arrivals_per_hour=args.arrivals_per_hour,
            diurnal_amplitude=args.diurnal_amplitude, duration_median_s=args.duration_median_s,
            llm_fraction=args.llm_fraction,
        )  # fmt: skip
    except ValueError as e:
        print(f"synthetic: {e}", file=sys.stderr)
        return 2
    jobs, nodes = generate(spec, np.random.default_rng(args.seed))
    args.out.mkdir(parents=True, exist_ok=True)
    write_jobs(args.out / "jobs.csv", jobs)
    write_nodes(args.out / "nodes.csv", nodes)
    print(f"wrote {len(jobs):,} jobs to {args.out / 'jobs.csv'} and {len(nodes):,} nodes to {args.out / 'nodes.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
