"""Time-weighted metrics (Eq. 1-3, node-hours, fragmentation) and job statistics."""

from __future__ import annotations

import math

import pytest

from coordinator.simulator.metrics import JobRecord, MetricsRecorder, summarize_jobs


def recorder(caps: list[float], idle: float = 100.0, peak: float = 500.0, **kw: object) -> MetricsRecorder:
    """A recorder over nodes with the same power curve, starting at t = 0."""
    return MetricsRecorder(caps, [idle] * len(caps), [peak] * len(caps), 0.0, **kw)  # type: ignore[arg-type]


class TestMetricsRecorder:
    """MetricsRecorder integrates piecewise-constant state exactly."""

    def test_energy_of_a_fixed_schedule(self) -> None:
        """Two 4-GPU nodes (100 → 500 W): 10 s at 400 W, then 10 s with one node off at 100 W."""
        m = recorder([4.0, 4.0])
        m.set_node(0, used_gpus=2.0, busy=True)  # u = 0.5 → 300 W; node 1 idle 100 W
        m.advance(10.0)
        m.set_node(0, used_gpus=0.0, busy=False)  # 100 W
        m.set_node(1, powered=False)  # 0 W
        m.advance(20.0)
        s = m.summary()
        # 400 W × 10 s + 100 W × 10 s = 5000 J
        assert s["energy_kwh"] == pytest.approx(5000 / 3.6e6)
        assert s["mean_power_w"] == pytest.approx(250.0)
        # node-seconds on: 2 × 10 + 1 × 10 = 30; busy: 1 × 10
        assert s["active_node_hours"] == pytest.approx(30 / 3600)
        assert s["busy_node_hours"] == pytest.approx(10 / 3600)

    def test_std_of_a_fixed_placement(self) -> None:
        """u = (1, 0.5, 0, 0): mean 0.375, σ = sqrt(0.6875 / 4) ≈ 0.41458 (Eq. 1-2)."""
        m = recorder([8.0] * 4)
        m.set_node(0, used_gpus=8.0, busy=True)
        m.set_node(1, used_gpus=4.0, busy=True)
        m.advance(100.0)
        s = m.summary()
        assert s["util_mean"] == pytest.approx(0.375)
        # deviations 0.625, 0.125, -0.375, -0.375 → squares sum 0.6875
        assert s["util_std"] == pytest.approx(math.sqrt(0.6875 / 4))

    def test_time_weighting(self) -> None:
        """σ of 0.5 for 30 s then 0 for 10 s averages to 0.375."""
        m = recorder([2.0, 2.0])
        m.set_node(0, used_gpus=2.0, busy=True)  # u = (1, 0): σ = 0.5
        m.advance(30.0)
        m.set_node(1, used_gpus=2.0, busy=True)  # u = (1, 1): σ = 0
        m.advance(40.0)
        assert m.summary()["util_std"] == pytest.approx((0.5 * 30) / 40)

    def test_powered_off_and_cpu_only_nodes_are_left_out_of_eq_1_2(self) -> None:
        """Only powered GPU nodes count for the mean and std-dev; a CPU-only node still counts as on."""
        m = MetricsRecorder([4.0, 4.0, 0.0], [100.0, 100.0, 0.0], [500.0, 500.0, 0.0], 0.0)
        m.set_node(0, used_gpus=4.0, busy=True)
        m.set_node(1, powered=False)
        m.set_node(2, busy=True)
        m.advance(10.0)
        s = m.summary()
        assert (s["util_mean"], s["util_std"]) == (1.0, 0.0)
        assert s["active_node_hours"] == pytest.approx(20 / 3600)  # nodes 0 and 2
        assert s["busy_node_hours"] == pytest.approx(20 / 3600)

    def test_fragmentation(self) -> None:
        """3 free GPUs on a partly used 4-GPU node, out of 12 GPUs, strand 0.25 of the cluster."""
        m = recorder([4.0, 4.0, 4.0])
        m.set_node(0, used_gpus=1.0, busy=True)  # 3 stranded; nodes 1-2 wholly free (not stranded)
        m.advance(10.0)
        s = m.summary()
        assert s["fragmentation"] == pytest.approx(0.25)
        assert s["fragmented_gpus_mean"] == pytest.approx(3.0)

    def test_checkpoint(self) -> None:
        """The checkpoint holds the summary as it stood at its time."""
        m = recorder([4.0], checkpoint_s=5.0)
        m.set_node(0, used_gpus=4.0, busy=True)  # 500 W
        m.advance(10.0)
        assert m.checkpoint is not None
        assert m.checkpoint["energy_kwh"] == pytest.approx(500 * 5 / 3.6e6)
        assert m.summary()["energy_kwh"] == pytest.approx(500 * 10 / 3.6e6)

    def test_series(self) -> None:
        """A sample records Eq. 1, Eq. 3 and the queue length at its time."""
        m = recorder([4.0])
        m.set_node(0, used_gpus=4.0, busy=True)
        m.sample(0.0, queue_len=3)
        assert m.series is not None
        assert (m.series.t_s, m.series.util_mean, m.series.power_w, m.series.queue_len) == ([0.0], [1.0], [500.0], [3])


class TestSummarizeJobs:
    """summarize_jobs: completion and queueing statistics."""

    def test_hand_computed(self) -> None:
        """JCTs 100, 140, 110 and waits 0, 90, 80 give their means and percentiles."""
        records = [JobRecord("a", 0, 0, 100, 4), JobRecord("b", 10, 100, 150, 8), JobRecord("c", 20, 100, 130, 2)]
        s = summarize_jobs(records, unplaced=1)
        assert s["jct_mean_s"] == pytest.approx(350 / 3)
        assert s["jct_p50_s"] == 110.0
        assert s["queue_delay_mean_s"] == pytest.approx(170 / 3)
        assert s["queue_delay_large_mean_s"] == 90.0  # only b asks for ≥ 8 GPUs
        assert (s["makespan_s"], s["completed_jobs"], s["waited_jobs"], s["unplaced_jobs"]) == (150.0, 3, 2, 1)

    def test_no_jobs(self) -> None:
        """Without finished jobs every statistic is 0."""
        s = summarize_jobs([], unplaced=2)
        assert (s["jct_mean_s"], s["makespan_s"], s["unplaced_jobs"]) == (0.0, 0.0, 2)
