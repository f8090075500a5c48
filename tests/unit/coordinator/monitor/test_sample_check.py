"""The telemetry check's quick path agrees with the full check on every sample (hypothesis)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.pb.gptrm.v1 import types_pb2
from coordinator.monitor.sample_check import _first_problem, _plainly_fine, sample_problem

NOW = 1_700_000_000.0
_NUM = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, 0.5, 1.0, 1.0000001, -0.0,
                                                                                  -1e-9, 700.0, 5001.0, 260.0]))
_BYTES = st.one_of(st.integers(0, 2**40), st.sampled_from([0, 1, 80 << 30]))


@st.composite
def samples(draw: st.DrawFn) -> types_pb2.TelemetrySample:
    s = types_pb2.TelemetrySample(time_unix_s=draw(st.one_of(st.just(NOW), _NUM, st.floats(NOW, NOW + 2e5))))
    for i in range(draw(st.integers(0, 3))):
        g = s.gpus.add(index=i)
        for name in ("util_gpu", "util_mem", "power_w", "power_limit_w", "energy_j", "temperature_c"):
            if draw(st.booleans()):
                setattr(g, name, draw(_NUM))
        for name in ("mem_used_bytes", "mem_total_bytes"):
            if draw(st.booleans()):
                setattr(g, name, draw(_BYTES))
    h = s.host
    for name in ("cpu_util", "load1", "load5", "load15", "cpu_power_w"):
        if draw(st.booleans()):
            setattr(h, name, draw(_NUM))
    for name in ("mem_used_bytes", "mem_total_bytes"):
        if draw(st.booleans()):
            setattr(h, name, draw(_BYTES))
    return s


class TestQuickPath:
    @pytest.mark.slow
    @settings(max_examples=3000, deadline=None)
    @given(samples())
    def test_quick_path_accepts_only_what_the_full_check_accepts(self, sample: types_pb2.TelemetrySample) -> None:
        """Whenever the quick test passes a sample the full check finds no problem, so the answer is the same."""
        if _plainly_fine(sample, NOW):
            assert _first_problem(sample, NOW) is None
        assert sample_problem(sample, NOW) == _first_problem(sample, NOW)

    def test_an_ordinary_sample_takes_the_quick_path(self) -> None:
        """A normal 8-GPU sample is accepted without the full check (the ingest hot path)."""
        s = types_pb2.TelemetrySample(time_unix_s=NOW)
        for i in range(8):
            s.gpus.add(index=i, util_gpu=0.5, util_mem=0.3, power_w=400.0, power_limit_w=700.0, energy_j=1e6,
                       temperature_c=60.0, mem_used_bytes=10 << 30, mem_total_bytes=80 << 30)
        s.host.cpu_util, s.host.load1, s.host.mem_used_bytes, s.host.mem_total_bytes = 0.2, 3.0, 1 << 30, 8 << 30
        assert _plainly_fine(s, NOW) and sample_problem(s, NOW) is None
        s.gpus[3].power_w = math.nan
        assert sample_problem(s, NOW) == "gpus[3].power_w is nan"
