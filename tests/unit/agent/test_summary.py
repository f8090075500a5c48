"""The agent's telemetry summaries: mean, max and last per field, one per report interval, bounded."""

from __future__ import annotations

import random
import sys

import pytest

from agent.outbox import Outbox
from agent.summary import Summariser
from common.pb.gptrm.v1 import types_pb2

GIB = 1 << 30


def _sample(t: float, util: float, power: float, mem_gib: int, *, energy: float = 0.0,
            cpu: float = 0.1, rx: int = 0) -> types_pb2.TelemetrySample:
    gpu = types_pb2.GpuSample(index=0, uuid="GPU-0", util_gpu=util, power_w=power, temperature_c=40 + util * 10,
                              sm_clock_mhz=1000 + int(util * 100), mem_used_bytes=mem_gib * GIB,
                              mem_total_bytes=80 * GIB, energy_j=energy, power_limit_w=700.0, healthy=True)
    host = types_pb2.HostSample(cpu_util=cpu, load1=cpu * 10, mem_used_bytes=mem_gib * GIB, mem_total_bytes=512 * GIB,
                                net_rx_bytes_total=rx, cpu_power_w=100 + cpu * 100)
    return types_pb2.TelemetrySample(time_unix_s=t, gpus=[gpu], host=host)


def _feed(s: Summariser, samples: list[types_pb2.TelemetrySample]) -> list[types_pb2.TelemetrySample]:
    return [out for x in samples if (out := s.add(x)) is not None]


class TestSummariser:
    def test_every_sample_passes_at_the_sampling_interval(self) -> None:
        """A report interval at or below the sampling interval changes nothing: each sample goes, untouched."""
        s = Summariser(1.0)
        s.set_report_interval(1.0)
        samples = [_sample(100 + i, 0.5, 300, 10) for i in range(3)]
        out = _feed(s, samples)
        assert out == samples and all(x.summarised_samples == 0 for x in out)

    def test_one_summary_per_interval_with_mean_max_last(self) -> None:
        """Five 1 s samples at a 5 s interval make one summary: means, maxima and the last sample's levels
        and counters."""
        s = Summariser(1.0)
        s.set_report_interval(5.0)
        utils = [0.1, 0.9, 0.5, 0.3, 0.2]
        samples = [_sample(100 + i, u, 100 + 100 * i, mem_gib=10 + 5 * (i == 2), energy=1000.0 + 10 * i,
                           cpu=0.1 * (i + 1), rx=50 * i) for i, u in enumerate(utils)]
        out = _feed(s, samples)
        assert len(out) == 1
        x = out[0]
        g, h = x.gpus[0], x.host
        assert x.time_unix_s == 104 and x.summarised_samples == 5 and x.summary_of_s == pytest.approx(5.0)
        assert g.util_gpu == pytest.approx(sum(utils) / 5) and g.util_gpu_max == pytest.approx(0.9)
        assert g.power_w == pytest.approx(300.0) and g.power_w_max == pytest.approx(500.0)
        assert g.temperature_c == pytest.approx(40 + 10 * sum(utils) / 5) and g.temperature_c_max == pytest.approx(49)
        assert g.sm_clock_mhz == round(sum(1000 + int(u * 100) for u in utils) / 5)
        assert g.mem_used_bytes == 10 * GIB and g.mem_used_bytes_max == 15 * GIB     # last, max
        assert g.energy_j == 1040.0 and g.power_limit_w == 700.0 and g.healthy      # counters and levels: last
        assert not g.HasField("util_mem")                                            # never reported: none
        assert h.cpu_util == pytest.approx(0.3) and h.cpu_util_max == pytest.approx(0.5)
        assert h.cpu_power_w == pytest.approx(130.0) and h.cpu_power_w_max == pytest.approx(150.0)
        assert h.load1 == pytest.approx(5.0) and h.net_rx_bytes_total == 200 and h.mem_used_bytes_max == 15 * GIB

    def test_windows_follow_one_another(self) -> None:
        """Twenty 1 s samples at 10 s make two summaries of ten, each covering 10 s from the previous one."""
        s = Summariser(1.0)
        s.set_report_interval(10.0)
        out = _feed(s, [_sample(100 + i, 0.5, 300, 10) for i in range(20)])
        assert [(x.time_unix_s, x.summarised_samples, x.summary_of_s) for x in out] == [(109, 10, 10.0),
                                                                                       (119, 10, 10.0)]

    def test_missing_field_stays_missing(self) -> None:
        """A GPU that never reported a field has none in the summary (unknown is not zero)."""
        s = Summariser(1.0)
        s.set_report_interval(2.0)
        samples = [types_pb2.TelemetrySample(time_unix_s=100 + i, gpus=[types_pb2.GpuSample(index=0, util_gpu=0.5)])
                   for i in range(2)]
        (x,) = _feed(s, samples)
        assert x.gpus[0].util_gpu == 0.5 and not x.gpus[0].HasField("power_w")
        assert not x.gpus[0].HasField("power_w_max") and not x.host.HasField("cpu_power_w_max")

    def test_back_to_every_sample_sends_what_was_pending(self) -> None:
        """When the interval drops to the sampling interval the partial window goes out as a summary first."""
        s = Summariser(1.0)
        s.set_report_interval(10.0)
        assert _feed(s, [_sample(100 + i, 0.5, 300, 10) for i in range(3)]) == []
        flushed = s.set_report_interval(1.0)
        assert flushed is not None and flushed.summarised_samples == 3
        assert s.add(_sample(103, 0.5, 300, 10)) is not None and s.pending == 0

    def test_memory_does_not_grow_with_the_interval(self) -> None:
        """An hour of samples at a one-hour interval keeps sums, not samples."""
        s = Summariser(1.0)
        s.set_report_interval(3600.0)
        _feed(s, [_sample(100 + i, 0.5, 300, 10) for i in range(100)])
        before = sys.getsizeof(s._gpu) + sys.getsizeof(s._host)
        _feed(s, [_sample(200 + i, 0.5, 300, 10) for i in range(3000)])
        assert s.pending == 3100
        assert sys.getsizeof(s._gpu) + sys.getsizeof(s._host) == before
        assert len(s._gpu) == 5    # GPU 0 × (util, power, temperature, SM clock, memory used)


class TestOutboxSummaries:
    def test_outbox_queues_summaries_and_its_quiet_time_follows(self) -> None:
        """After a change the first window is random (agents spread their reports), the next ones whole."""
        box = Outbox(10, sampling_interval_s=1.0, rng=random.Random(7))
        assert box.quiet_s == 0.0
        box.set_report_interval(5.0)
        assert box.quiet_s == 6.0
        for i in range(14):
            box.add_sample(_sample(100 + i, 0.5, 300, 10))
        counts = [x.summarised_samples for x in box.take_samples(10)]
        assert 1 <= counts[0] <= 5 and counts[1:] == [5, 5]
        box.set_report_interval(0.0)   # an older coordinator: every sample again, what was pending first
        box.add_sample(_sample(114, 0.5, 300, 10))
        pending = 14 - sum(counts)
        assert [x.summarised_samples for x in box.take_samples(10)] == ([pending] if pending else []) + [0]

    def test_first_windows_spread_over_the_interval(self) -> None:
        """Many agents told the same interval at the same moment report at different seconds."""
        firsts = set()
        for seed in range(50):
            s = Summariser(1.0, random.Random(seed))
            s.set_report_interval(10.0)
            out = _feed(s, [_sample(100 + i, 0.5, 300, 10) for i in range(10)])
            firsts.add(out[0].time_unix_s)
        assert len(firsts) >= 7
