"""Synthetic traces and the trace → cluster/requests adapter (power model and profiler)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import coordinator.profiler.profiler
from coordinator.domain import Resources
from coordinator.simulator.synthetic import SyntheticSpec, generate, llm_gpus
from coordinator.simulator.trace import TraceJob, TraceNode
from coordinator.simulator.workload import (
    GIB,
    NodeDefaults,
    build_cluster,
    build_jobs,
    gang_split,
    job_spec,
    without_run_estimates,
)


class TestSynthetic:
    """generate: seeded, shaped by its spec."""

    def test_seeded(self) -> None:
        """The same seed gives the same trace; another seed another one."""
        spec = SyntheticSpec(n_jobs=50, n_nodes=5, llm_fraction=0.3)
        assert generate(spec, np.random.default_rng(1)) == generate(spec, np.random.default_rng(1))
        assert generate(spec, np.random.default_rng(1))[0] != generate(spec, np.random.default_rng(2))[0]

    def test_shape(self) -> None:
        """Jobs are sorted, last at most duration_max_s, take GPU counts from the distribution; nodes too."""
        spec = SyntheticSpec(n_jobs=400, n_nodes=30, gpu_counts={1: 1.0, 16: 1.0}, node_gpus={8: 1.0},
                             duration_max_s=5000.0, diurnal_amplitude=0.5)  # fmt: skip
        jobs, nodes = generate(spec, np.random.default_rng(3))
        assert len(jobs) == 400 and len(nodes) == 30
        assert [j.submit_s for j in jobs] == sorted(j.submit_s for j in jobs)
        assert {j.gpus for j in jobs} == {1, 16}
        assert all(0 < j.duration_s <= 5000.0 for j in jobs)
        assert {n.gpus for n in nodes} == {8}

    def test_llm_rows_take_the_profilers_gpu_count(self) -> None:
        """An LLM row carries its kind and size, and the GPU count the profiler derives for it."""
        jobs, _ = generate(SyntheticSpec(n_jobs=200, llm_fraction=1.0, gpu_counts={1: 1.0}), np.random.default_rng(4))
        profiler = coordinator.profiler.profiler.Profiler(gpu_model_mem_bytes=80 * GIB)
        assert all(j.kind and j.params_b > 0 for j in jobs)
        for j in jobs[:20]:
            assert (j.gpus, j.gpu_share) == llm_gpus(profiler, j.kind, j.params_b, 8)

    def test_70b_training_is_a_gang(self) -> None:
        """Adam training of 70 B parameters (16 bytes each ≈ 1.1 TB) needs more than one 8×80 GiB server."""
        profiler = coordinator.profiler.profiler.Profiler(gpu_model_mem_bytes=80 * GIB)
        gpus, share = llm_gpus(profiler, "training", 70.0, 8)
        assert gpus > 8 and share == 1.0

    def test_bad_spec(self) -> None:
        """A negative weight or rate is refused when the spec is built."""
        with pytest.raises(ValueError, match="gpu_counts"):
            SyntheticSpec(gpu_counts={1: -1.0})
        with pytest.raises(ValueError, match="arrivals_per_hour"):
            SyntheticSpec(arrivals_per_hour=0.0)


class TestBuildCluster:
    """build_cluster: trace nodes with defaults and datasheet power curves."""

    def test_defaults_and_power_model(self) -> None:
        """A Philly-like node (GPU count only) gets the default P100 16 GiB and 30 → 250 W per GPU."""
        (n,) = build_cluster([TraceNode("m0", 8)]).nodes
        assert n.gpu_model == NodeDefaults().gpu_model and len(n.gpus) == 8
        assert n.capacity == Resources(8.0, 8 * 16 * GIB, 64.0, 8 * 64 * GIB, 4096 * GIB)
        assert (n.power.idle_w, n.power.max_w) == (240.0, 2000.0)

    def test_known_model_and_host_power(self) -> None:
        """A T4 node gets 10 → 70 W per GPU, plus the constant host power when one is set."""
        (n,) = build_cluster([TraceNode("x", 2, "T4", 16.0, 104.0, 256.0)], NodeDefaults(host_idle_w=50.0)).nodes
        assert (n.power.idle_w, n.power.max_w) == (70.0, 190.0)
        assert (n.capacity.cpu_cores, n.capacity.mem_bytes) == (104.0, 256 * GIB)

    def test_cpu_only_node(self) -> None:
        """A node without GPUs draws nothing in the GPU power model."""
        (n,) = build_cluster([TraceNode("c", 0, "", None, 32.0, 128.0)]).nodes
        assert (n.capacity.gpus, n.power.max_w, n.gpus) == (0.0, 0.0, ())

    def test_bad_defaults(self) -> None:
        """Non-positive GPU memory defaults are refused."""
        with pytest.raises(ValueError, match="gpu_mem_gib"):
            NodeDefaults(gpu_mem_gib=0.0)


class TestBuildJobs:
    """build_jobs: every request comes from the profiler."""

    @pytest.mark.parametrize(("gpus", "width", "expected"), [(1, 8, (1, 1)), (8, 8, (1, 8)), (16, 8, (2, 8)),
                                                             (32, 8, (4, 8)), (12, 8, (2, 6))])  # fmt: skip
    def test_gang_split(self, gpus: int, width: int, expected: tuple[int, int]) -> None:
        """Jobs wider than the widest node spread evenly over ceil(gpus / width) nodes."""
        assert gang_split(gpus, width) == expected

    def test_trace_job_spec(self) -> None:
        """A 16-GPU Philly job is a 2-node gang of 8; a shared openb pod keeps its fraction and host request."""
        philly = job_spec(TraceJob("p", 0, 10, 16), 8)
        assert (philly.nodes, philly.demand) == (2, Resources(gpus=8.0))
        pod = job_spec(TraceJob("o", 0, 10, 1, 0.25, 4.0, 8.0), 8)
        assert pod.allow_gpu_sharing and pod.demand == Resources(gpus=0.25, cpu_cores=4.0, mem_bytes=8 * GIB)

    def test_requests_come_from_the_profiler(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Profiler.request makes every request; an LLM job gets the profiler's per-GPU memory."""
        seen: list[str] = []
        original = coordinator.profiler.profiler.Profiler.request

        def recording(self: coordinator.profiler.profiler.Profiler, task_id: str, spec: Any, **kw: Any) -> Any:
            seen.append(task_id)
            return original(self, task_id, spec, **kw)

        monkeypatch.setattr(coordinator.profiler.profiler.Profiler, "request", recording)
        cluster = build_cluster([TraceNode("a", 8, "A100", 80.0, 128.0, 1024.0)])
        trace = [TraceJob("t", 0, 10, 2, 1.0, None, None), TraceJob("l", 5, 10, 1, 1.0, None, None, "", "",
                                                                    "fine-tuning", 7.0)]  # fmt: skip
        jobs = build_jobs(trace, cluster)
        assert seen == ["t", "l"]
        assert (jobs[0].request.demand.gpus, jobs[0].request.gpu_mem_per_gpu_bytes) == (2.0, 0)
        assert jobs[1].request.gpu_mem_per_gpu_bytes > 0 and jobs[1].request.submit_s == 5
        assert jobs[1].duration_s == 10


def test_the_leaders_view_of_trace_jobs_has_no_run_time() -> None:
    cluster = build_cluster([TraceNode("a", 8, "A100", 80.0, 128.0, 1024.0)])
    jobs = build_jobs([TraceJob("t", 0, 10, 2, 1.0, None, None), TraceJob("u", 3, 20, 1, 1.0, None, None)], cluster)
    assert [j.request.expected_run_s for j in jobs] == [10, 20]    # the trace's: what --oracle decides with
    seen = without_run_estimates(jobs)
    assert [j.request.expected_run_s for j in seen] == [None, None]
    assert [(j.duration_s, j.request.task_id, j.request.demand) for j in seen] == \
        [(j.duration_s, j.request.task_id, j.request.demand) for j in jobs]   # nothing else changes
