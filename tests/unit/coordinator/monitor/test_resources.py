"""Resource Monitor: ring buffers and the paper's objectives (Eq. 1-3)."""

from __future__ import annotations

import math

import pytest

from common.pb.gptrm.v1 import types_pb2
from coordinator.monitor.resources import ResourceMonitor


def _sample(t: float, utils: list[float], power: list[float], energy: list[float] | None = None,
            cpu_power: float | None = None) -> types_pb2.TelemetrySample:
    s = types_pb2.TelemetrySample(time_unix_s=t)
    for i, (u, p) in enumerate(zip(utils, power, strict=True)):
        g = s.gpus.add(index=i, util_gpu=u, power_w=p, mem_used_bytes=10, mem_total_bytes=100)
        if energy is not None:
            g.energy_j = energy[i]
    if cpu_power is not None:
        s.host.cpu_power_w = cpu_power
    return s


class TestResourceMonitor:
    def test_objectives(self) -> None:
        """Eq. 1 mean of node utilizations, Eq. 2 their population std-dev, Eq. 3 the sum of power."""
        mon = ResourceMonitor(history_s=10, interval_s=1, now=lambda: 0.0)
        mon.ingest("a", 2, [_sample(1, [0.2, 0.4], [100, 200], cpu_power=50)])   # u=0.3, p=350
        mon.ingest("b", 2, [_sample(1, [0.9, 0.9], [400, 400])])                 # u=0.9, p=800
        o = mon.objectives
        assert o.util_mean == pytest.approx(0.6)
        assert o.util_std == pytest.approx(0.3)          # |0.3-0.6| = |0.9-0.6| = 0.3
        assert o.power_w == pytest.approx(1150)
        assert o.gpu_mem_util == pytest.approx(0.1)
        mon.deactivate("b")
        assert mon.objectives.util_mean == pytest.approx(0.3) and mon.objectives.nodes == 1

    def test_ring_buffer_is_bounded(self) -> None:
        """History keeps the last capacity samples, oldest first, and absent fields are NaN."""
        mon = ResourceMonitor(history_s=5, interval_s=1)
        for t in range(12):
            mon.ingest("a", 1, [_sample(t, [t / 100], [float(t)])])
        times, power = mon.history("a").series("power_w", 0)
        assert list(times) == [7, 8, 9, 10, 11] and list(power) == [7, 8, 9, 10, 11]
        _, temp = mon.history("a").series("temperature_c", 0)
        assert all(math.isnan(v) for v in temp)

    def test_energy_trapezoid_and_counters(self) -> None:
        """Energy integrates power over time, or follows NVML energy counters when every GPU has one."""
        mon = ResourceMonitor(history_s=60, interval_s=1)
        mon.ingest("a", 1, [_sample(0, [0.5], [100]), _sample(10, [0.5], [300])])
        assert mon.objectives.energy_j == pytest.approx(2000)   # (100+300)/2 * 10 s
        mon.ingest("b", 1, [_sample(0, [0.5], [100], energy=[5000]), _sample(1, [0.5], [100], energy=[5600])])
        assert mon.objectives.energy_j == pytest.approx(2600)

    def test_missing_fields_unknown_gpus_and_partial_counters(self) -> None:
        """A GPU that reports no utilization is left out of the node mean (not counted as 0); a
        sample for a GPU index beyond the inventory is ignored; energy falls back to the power
        integral when only some GPUs have a counter; every stored field lands in its own column."""
        mon = ResourceMonitor(history_s=60, interval_s=1, now=lambda: 0.0)
        s = types_pb2.TelemetrySample(time_unix_s=0)
        s.gpus.add(index=0, util_gpu=0.8, power_w=100, energy_j=1000, temperature_c=61, sm_clock_mhz=1980,
                   ecc_uncorrected_total=3)
        s.gpus.add(index=1, power_w=50)                       # utilization not supported
        s.gpus.add(index=7, util_gpu=0.0, power_w=999)         # not in a 2-GPU inventory
        s2 = types_pb2.TelemetrySample()
        s2.CopyFrom(s)
        s2.time_unix_s = 4
        mon.ingest("a", 2, [s, s2])
        assert mon.node_current("a") == pytest.approx((0.8, 150.0))
        assert mon.objectives.energy_j == pytest.approx(600)   # 150 W x 4 s, GPU 1 has no counter
        hist = mon.history("a")
        assert list(hist.series("temperature_c", 0)[1]) == [61, 61]
        assert list(hist.series("sm_clock_mhz", 0)[1]) == [1980, 1980]
        assert list(hist.series("ecc_uncorrected_total", 0)[1]) == [3, 3]
        assert math.isnan(hist.series("util_gpu", 1)[1][-1])

    def test_objectives_follow_every_batch(self) -> None:
        """Objectives read after any batch reflect it, however many batches came in between."""
        mon = ResourceMonitor(history_s=10, interval_s=1, now=lambda: 0.0)
        for k in range(50):
            mon.ingest(f"n{k}", 1, [_sample(1, [k / 100], [10.0])])
        assert mon.objectives.nodes == 50 and mon.objectives.power_w == pytest.approx(500)
        mon.ingest("n0", 1, [_sample(2, [1.0], [510.0])])
        assert mon.objectives.power_w == pytest.approx(1000)
        assert mon.objectives.util_mean == pytest.approx((sum(k / 100 for k in range(1, 50)) + 1.0) / 50)
