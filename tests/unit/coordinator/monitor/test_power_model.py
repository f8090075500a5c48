"""Tests for node power curves (coordinator/power_model.py)."""

from __future__ import annotations

import numpy as np
import pytest

from common.pb.gptrm.v1 import types_pb2
from coordinator.domain import PowerCurve
from coordinator.monitor.power_model import (
    MIN_SAMPLES,
    REFIT_EVERY,
    NodePowerFit,
    PowerModel,
    datasheet_curve,
    fit_line,
)
from coordinator.monitor.resources import ResourceMonitor

GIB = 1024**3


class TestDatasheet:
    """Defaults per GPU model, times the GPU count."""

    @pytest.mark.parametrize(
        ("model", "gpus", "mem_gib", "expected"),
        [
            ("NVIDIA H100 80GB HBM3", 8, 80, (560.0, 5600.0)),
            ("NVIDIA A100-SXM4-40GB", 4, 40, (200.0, 1600.0)),
            ("NVIDIA L4", 2, 24, (32.0, 144.0)),
            ("Tesla V100-SXM2-32GB", 1, 32, (35.0, 300.0)),
            ("Tesla T4", 1, 16, (10.0, 70.0)),
            ("Tesla P100-PCIE-16GB", 1, 16, (30.0, 250.0)),
            # Unknown models by memory: ≥ 80 GiB like an H100, ≥ 40 like an A100, ≥ 24 like an L4.
            ("Mystery X", 1, 96, (70.0, 700.0)),
            ("Mystery Y", 1, 48, (50.0, 400.0)),
            ("Mystery Z", 1, 24, (16.0, 72.0)),
            ("", 0, 0, (0.0, 0.0)),
        ],
    )
    def test_table(self, model: str, gpus: int, mem_gib: int, expected: tuple[float, float]) -> None:
        """Each GPU model maps to its datasheet idle/max power."""
        assert datasheet_curve(model, gpus, mem_gib * GIB) == PowerCurve(*expected)


class TestFit:
    """Least squares once there are enough samples over enough range."""

    def test_fit_recovers_a_line(self) -> None:
        """Noise-free samples of 600 + 4000·u give idle 600 W and max 4600 W."""
        util = np.linspace(0.1, 0.9, 9)
        curve = fit_line(util, 600 + 4000 * util)
        assert curve is not None
        assert curve.idle_w == pytest.approx(600.0) and curve.max_w == pytest.approx(4600.0)

    @pytest.mark.parametrize(
        ("util", "power"),
        [([0.5, 0.5], [100.0, 200.0]), ([0.1, 0.9], [500.0, 100.0]), ([0.1], [100.0])],
    )
    def test_unusable_fits(self, util: list[float], power: list[float]) -> None:
        """No spread, a falling line or a single point gives no fit."""
        assert fit_line(np.array(util), np.array(power)) is None

    def test_model_switches_to_the_fit(self) -> None:
        """The default holds until 30 samples spanning 0.2 of utilization exist, then the fit wins."""
        model, rng = PowerModel(), np.random.default_rng(7)
        default = model.curve("n", "NVIDIA H100", 8)
        for u in np.linspace(0.40, 0.55, MIN_SAMPLES):  # enough samples, span only 0.15
            model.observe("n", float(u), 600 + 4000 * float(u))
        assert model.curve("n", "NVIDIA H100", 8) == default
        for u in rng.uniform(0.0, 1.0, MIN_SAMPLES):
            model.observe("n", float(u), 600 + 4000 * float(u) + float(rng.normal(0, 5)))
        fitted = model.curve("n", "NVIDIA H100", 8)
        assert fitted.idle_w == pytest.approx(600, abs=10) and fitted.max_w == pytest.approx(4600, abs=10)
        model.forget("n")
        assert model.curve("n", "NVIDIA H100", 8) == default

    def test_bad_samples_are_ignored(self) -> None:
        """NaN, negative power and utilization outside 0..1 never reach the fit."""
        model = PowerModel()
        for u in np.linspace(0, 1, 40):
            model.observe("n", float("nan"), 100.0)
            model.observe("n", float(u) + 2, 100.0)
            model.observe("n", float(u), -1.0)
        assert model.curve("n", "NVIDIA L4", 1) == datasheet_curve("NVIDIA L4", 1)


class TestWindow:
    def test_the_window_keeps_the_latest_samples(self) -> None:
        """Past its window the fit uses only the newest samples: an old line is forgotten, the count stays bounded."""
        fit = NodePowerFit(window=64)
        rng = np.random.default_rng(1)
        for u in rng.uniform(0, 1, 500):
            fit.add(float(u), 100 + 400 * float(u))       # the old behaviour: 100 W idle, 500 W max
        for u in rng.uniform(0, 1, 64):
            fit.add(float(u), 200 + 600 * float(u))       # the new one fills the whole window
        assert len(fit) == 64
        curve = fit.curve()
        assert curve is not None
        assert curve.idle_w == pytest.approx(200, abs=0.01) and curve.max_w == pytest.approx(800, abs=0.05)


    def test_sums_fit_like_least_squares_over_the_window(self) -> None:
        """The fit from per-chunk sums is the least-squares line of the samples in the window, which slides a
        chunk at a time and never holds more than the window; the kept state is the same size however many
        samples came."""
        fit, rng = NodePowerFit(window=256), np.random.default_rng(11)
        util = rng.uniform(0, 1, 1000)
        power = 300 + 2000 * util + rng.normal(0, 40, 1000)
        size = fit._closed.nbytes
        for n, (u, p) in enumerate(zip(util, power, strict=True), start=1):
            fit.add(float(u), float(p))
            assert len(fit) <= 256
            if n in (40, 256, 700, 1000):
                k = len(fit)
                assert k > 256 - 8 or n < 256
                expected = fit_line(util[n - k:n], power[n - k:n])
                got = fit._compute()
                assert got is not None and expected is not None
                assert got.idle_w == pytest.approx(expected.idle_w) and got.max_w == pytest.approx(expected.max_w)
        assert fit._closed.nbytes == size <= 32 * 7 * 8


class TestOnlineFit:
    """Telemetry reaches the fit through the Resource Monitor; refits are spaced out."""

    def test_refit_waits_for_new_samples(self) -> None:
        """A changed line shows only once REFIT_EVERY new samples have arrived since the last fit."""
        model, rng = PowerModel(), np.random.default_rng(3)
        for u in rng.uniform(0, 1, MIN_SAMPLES):
            model.observe("n", float(u), 500 + 3000 * float(u))
        first = model.curve("n", "NVIDIA H100", 8)
        assert first.idle_w == pytest.approx(500) and first.max_w == pytest.approx(3500)
        for u in rng.uniform(0, 1, REFIT_EVERY - 1):
            model.observe("n", float(u), 900 + 5000 * float(u))
        assert model.curve("n", "NVIDIA H100", 8) == first
        model.observe("n", 0.5, 900 + 5000 * 0.5)
        refitted = model.curve("n", "NVIDIA H100", 8)
        assert refitted != first and refitted.idle_w > first.idle_w and refitted.max_w > first.max_w

    def test_monitor_feeds_gpu_power_and_utilization(self) -> None:
        """Each sample's mean GPU utilization and summed GPU power (not the CPU package) are observed;
        a sample without GPU power is not."""
        model = PowerModel()
        monitor = ResourceMonitor(history_s=60, interval_s=1, power_model=model)
        rng = np.random.default_rng(5)
        for t, u in enumerate(rng.uniform(0, 1, MIN_SAMPLES)):
            sample = types_pb2.TelemetrySample(time_unix_s=float(t))
            for i in range(2):   # two GPUs at the same utilization: 100 W idle and 400 W at full load each
                sample.gpus.add(index=i, util_gpu=float(u), power_w=100 + 300 * float(u))
            sample.host.cpu_power_w = 250.0
            monitor.ingest("n", 2, [sample])
        silent = types_pb2.TelemetrySample(time_unix_s=99.0)
        silent.gpus.add(index=0, util_gpu=0.9)
        monitor.ingest("n", 2, [silent])
        curve = model.curve("n", "NVIDIA L4", 2)
        assert curve.idle_w == pytest.approx(200) and curve.max_w == pytest.approx(800)

    def test_explain_says_where_the_curve_comes_from(self) -> None:
        """Datasheet (with the sample count so far) until the fit is usable, then fitted."""
        model = PowerModel()
        assert model.explain("n", "NVIDIA L4", 2, 24 * GIB) == (datasheet_curve("NVIDIA L4", 2), "datasheet", 0)
        for u in np.linspace(0, 1, MIN_SAMPLES - 1):
            model.observe("n", float(u), 40 + 100 * float(u))
        assert model.explain("n", "NVIDIA L4", 2)[1:] == ("datasheet", MIN_SAMPLES - 1)
        model.observe("n", 0.5, 90.0)
        curve, source, samples = model.explain("n", "NVIDIA L4", 2)
        assert source == "fitted" and samples == MIN_SAMPLES
        assert curve.idle_w == pytest.approx(40) and curve.max_w == pytest.approx(140)
        assert model.curve("n", "NVIDIA L4", 2) == curve
