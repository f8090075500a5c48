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


class TestPoisonedSamples:
    @pytest.mark.parametrize("poison", [
        {"time_unix_s": math.nan}, {"time_unix_s": math.inf}, {"time_unix_s": -5.0}, {"time_unix_s": 1e12},
        {"power_w": math.nan}, {"power_w": -1.0}, {"power_w": math.inf}, {"power_w": 1e9},
        {"util_gpu": 7.0}, {"util_gpu": math.nan}, {"energy_j": -3.0}, {"cpu_util": math.nan},
        {"cpu_power_w": -50.0}, {"mem_used_bytes": 1000},
    ])
    def test_impossible_sample_is_dropped_and_counted(self, poison: dict[str, float]) -> None:
        """A sample with a NaN, infinite, negative or impossible value is dropped and counted for its node,
        and the cluster's energy and objectives stay finite."""
        mon = ResourceMonitor(history_s=60, interval_s=1, now=lambda: 100.0)
        assert mon.ingest("a", 1, [_sample(10, [0.5], [100])]) == 1
        bad = _sample(11, [0.5], [100])
        for key, value in poison.items():
            if key == "time_unix_s":
                bad.time_unix_s = value
            elif key in ("cpu_util", "cpu_power_w"):
                setattr(bad.host, key, value)
            else:
                setattr(bad.gpus[0], key, value)
        assert mon.ingest("a", 1, [bad, _sample(20, [0.5], [300])]) == 1
        assert mon.rejected == {"a": 1}
        assert mon.last_rejection["a"]
        o = mon.objectives
        assert all(math.isfinite(v) for v in (o.util_mean, o.util_std, o.power_w, o.gpu_mem_util, o.energy_j))
        assert o.energy_j == pytest.approx(2000)   # (100+300)/2 W x 10 s: the bad sample is not in the integral
        assert mon.history("a").count == 2

    def test_many_gpus_keep_history_bounded(self) -> None:
        """A node registering hundreds of GPUs keeps fewer samples, never more than the per-node byte budget."""
        from coordinator.monitor.resources import NODE_HISTORY_BYTES
        mon = ResourceMonitor(history_s=900, interval_s=1, now=lambda: 100.0)
        mon.ingest("big", 256, [_sample(1, [0.5], [100])])
        mon.ingest("small", 8, [_sample(1, [0.5], [100])])
        assert mon.history("big").nbytes <= NODE_HISTORY_BYTES
        assert (mon.history("small").capacity, mon.history("small").coarse_capacity) == (60, 15)


class TestDownsampledHistory:
    """The last minute per sample, older history per minute (mean and maximum), memory fixed by the settings."""

    def test_history_older_than_the_fine_window_comes_back_per_minute(self) -> None:
        mon = ResourceMonitor(history_s=600, interval_s=1, now=lambda: 1000.0)
        for t in range(300):
            mon.ingest("a", 1, [_sample(t, [0.5], [float(t)], cpu_power=float(2 * t))])
        hist = mon.history("a")
        times, power = hist.series("power_w", 0)
        # Buckets [0, 60) ... [180, 240) closed, each timed at its start; then every sample of the last minute.
        assert list(times[:4]) == [0, 60, 120, 180] and list(power[:4]) == [29.5, 89.5, 149.5, 209.5]
        assert list(times[4:]) == list(range(240, 300)) and list(power[4:]) == list(range(240, 300))
        _, peak = hist.series("power_w", 0, stat="max")
        assert list(peak[:4]) == [59, 119, 179, 239] and list(peak[4:]) == list(range(240, 300))
        host_times, cpu_power = hist.series("cpu_power_w")
        assert list(host_times) == list(times) and list(cpu_power[:2]) == [59.0, 179.0]
        assert hist.latest("power_w", 0) == 299.0 and hist.latest("power_w", 1) is None
        with pytest.raises(ValueError):
            hist.series("power_w", 0, stat="median")

    def test_a_bucket_the_fine_window_starts_in_is_kept_too(self) -> None:
        """No gap: the closed bucket the oldest sample falls in comes back as well (its mean, then its samples left)."""
        mon = ResourceMonitor(history_s=600, interval_s=1, now=lambda: 1000.0)
        for t in range(330):
            mon.ingest("a", 1, [_sample(t, [0.5], [float(t)])])
        times, power = mon.history("a").series("power_w", 0)
        assert list(times[:6]) == [0, 60, 120, 180, 240, 270] and power[4] == 269.5
        assert len(times) == 5 + 60

    def test_absent_fields_late_samples_and_empty_buckets(self) -> None:
        """A field missing from some samples of a minute is the mean of those that had it (NaN when none had);
        a late sample (older than the open minute) joins that minute; a silent minute leaves no row."""
        mon = ResourceMonitor(history_s=600, interval_s=1, now=lambda: 1000.0)
        for t in range(60):
            s = _sample(t, [0.5], [100.0 if t % 2 else 300.0])
            if t < 30:
                s.gpus[0].temperature_c = 40.0 + t
            mon.ingest("a", 1, [s])
        mon.ingest("a", 1, [_sample(60, [0.5], [50.0]), _sample(30.5, [0.5], [1000.0])])   # the second one late
        for t in range(180, 300):                                                         # [120, 180) silent
            mon.ingest("a", 1, [_sample(t, [0.5], [50.0])])
        hist = mon.history("a")
        times, power = hist.series("power_w", 0)
        assert list(times[:3]) == [0, 60, 180] and list(power[:3]) == [200.0, 525.0, 50.0]
        _, temp = hist.series("temperature_c", 0)
        assert temp[0] == pytest.approx(40 + 14.5) and math.isnan(temp[1])
        _, hottest = hist.series("temperature_c", 0, stat="max")
        assert hottest[0] == 69.0 and math.isnan(hottest[1])

    def test_a_nodes_memory_is_bounded_whatever_its_uptime(self) -> None:
        """A day of 1 Hz samples from 8 GPUs: the arrays are those allocated at the first sample (about 37 KiB
        for 15 minutes, where per-second rows took 369 KiB), and the series spans the history asked for."""
        mon = ResourceMonitor(history_s=900, interval_s=1, now=lambda: 1e6)
        utils, power = [0.5] * 8, [300.0] * 8
        mon.ingest("a", 8, [_sample(0, utils, power)])
        hist = mon.history("a")
        first = mon.memory_bytes
        assert first == hist.nbytes < 40 * 1024
        for t in range(1, 86_400, 7):      # one sample every 7 s keeps the test quick; the buckets still close
            hist.append(_sample(t, utils, power))
        assert mon.memory_bytes == first
        times, _ = hist.series("util_gpu", 3)
        assert len(times) <= hist.capacity + hist.coarse_capacity
        assert 86_400 - 900 - 60 <= times[0] <= 86_400 - 900

