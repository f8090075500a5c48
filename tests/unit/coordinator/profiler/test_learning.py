"""learn_from_task over the Resource Monitor's downsampled history: per-minute peaks and time-weighted means."""

from __future__ import annotations

import pytest

from common.pb.gptrm.v1 import types_pb2
from common.types import TaskState
from coordinator.monitor.resources import ResourceMonitor
from coordinator.profiler.learning import learn_from_task


class _Profiler:
    def __init__(self) -> None:
        self.seen: list[tuple[int, float]] = []

    def observe(self, spec: types_pb2.TaskSpec, peak_mem: int, util: float) -> None:
        self.seen.append((peak_mem, util))


def _task(started: float) -> types_pb2.Task:
    task = types_pb2.Task()
    task.spec.model.name = "llama"
    task.allocation.nodes.add(node_id="a", gpu_indices=[0])
    task.history.add(state=int(TaskState.RUNNING), time_unix_s=started)
    return task


def test_a_task_longer_than_the_fine_window_learns_its_peak_and_its_time_mean() -> None:
    """Ten minutes of a task: a one-second memory peak now inside a per-minute bucket still counts (the
    bucket's maximum), and utilization is averaged over time, a per-minute mean counting as its minute."""
    mon = ResourceMonitor(history_s=900, interval_s=1, now=lambda: 1000.0)
    for t in range(600):
        s = types_pb2.TelemetrySample(time_unix_s=float(t))
        util = 0.2 if t < 100 or t >= 540 else 0.8
        s.gpus.add(index=0, util_gpu=util, power_w=100.0, mem_used_bytes=50 if t == 200 else 10,
                   mem_total_bytes=100)
        mon.ingest("a", 1, [s])
    profiler = _Profiler()
    assert learn_from_task(profiler, _task(100.0), mon.history("a"))  # type: ignore[arg-type]
    (peak, util), = profiler.seen
    assert peak == 50
    # Buckets from 120 to 480 (0.8 for 420 s), then the samples 540..599 (0.2 for 60 s).
    assert util == pytest.approx((420 * 0.8 + 60 * 0.2) / 480, rel=1e-3)
