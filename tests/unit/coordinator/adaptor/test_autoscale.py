"""The replica-count decision: HPA formula, stabilization, cooldown, the action bound, missing signals."""

from __future__ import annotations

import pytest

from coordinator.adaptor.autoscale import Autoscaler, ScalePolicy, hpa_desired
from tests.helpers.clock import FakeClock


def _scaler(clock: FakeClock, **kw: float) -> Autoscaler:
    base = {"min_replicas": 1, "max_replicas": 8, "stabilization_s": 300.0, "cooldown_s": 60.0,
            "up_cooldown_s": 30.0, "max_actions": 3, "actions_window_s": 600.0}
    base.update(kw)
    return Autoscaler(ScalePolicy(**base), clock)  # type: ignore[arg-type]


class TestHpaFormula:
    @pytest.mark.parametrize(("current", "signal", "target", "want"), [
        (2, 0.9, 0.6, 3),     # ceil(2 * 1.5)
        (4, 0.3, 0.6, 2),     # ceil(4 * 0.5)
        (3, 0.62, 0.6, 3),    # within the 10 % band
        (1, 2.0, 0.5, 4),
        (5, 0.0, 0.6, 1),     # idle: down to one (bounds are the caller's)
    ])
    def test_desired_brings_signal_to_target(self, current: int, signal: float, target: float, want: int) -> None:
        """desired = ceil(current * signal / target), unchanged inside the tolerance band."""
        assert hpa_desired(current, signal, target) == want

    def test_throughput_floor_inverts_the_ratio(self) -> None:
        """For a tokens/s floor, half the wanted throughput doubles the count."""
        assert hpa_desired(2, 50.0, 100.0, higher_is_worse=False) == 4
        assert hpa_desired(4, 400.0, 100.0, higher_is_worse=False) == 1

    def test_nonfinite_signal_keeps_the_count(self) -> None:
        """A NaN signal changes nothing."""
        assert hpa_desired(3, float("nan"), 0.5) == 3


class TestAutoscaler:
    def test_scale_up_acts_at_once_and_clamps_to_max(self) -> None:
        """A high signal scales up immediately, never above MAX."""
        s = _scaler(FakeClock(), max_replicas=4)
        d = s.decide(2, 3.0, 0.5)
        assert (d.desired, d.acted) == (4, True)

    def test_scale_down_waits_for_the_stabilization_window(self) -> None:
        """A low signal lowers the count only after it stayed low for the whole window."""
        clock = FakeClock()
        s = _scaler(clock, cooldown_s=0.0, up_cooldown_s=0.0)
        assert s.decide(4, 0.6, 0.6).desired == 4            # on target: recommendation 4 recorded
        clock.advance(10)
        d = s.decide(4, 0.15, 0.6)
        assert d.desired == 4 and not d.acted and "stabilization" in d.reason
        clock.advance(200)
        assert s.decide(4, 0.15, 0.6).desired == 4
        clock.advance(120)                                   # the 4-recommendation is now older than 300 s
        d = s.decide(4, 0.15, 0.6)
        assert (d.desired, d.acted) == (1, True)

    def test_cooldown_after_an_action(self) -> None:
        """No action within the cooldown of the previous one, then the action happens."""
        clock = FakeClock()
        s = _scaler(clock, stabilization_s=0.0)
        assert s.decide(1, 1.0, 0.5).desired == 2
        clock.advance(10)
        d = s.decide(2, 1.0, 0.5)
        assert d.desired == 2 and "cooldown" in d.reason
        clock.advance(25)
        assert s.decide(2, 1.0, 0.5).desired == 4

    def test_actions_are_bounded_per_window(self) -> None:
        """A signal that swings every minute gets at most max_actions changes per window."""
        clock = FakeClock()
        s = _scaler(clock, stabilization_s=0.0, cooldown_s=0.0, up_cooldown_s=0.0, max_actions=3)
        current, acted = 2, 0
        for i in range(10):
            d = s.decide(current, 1.2 if i % 2 == 0 else 0.1, 0.6)
            acted += d.acted
            current = d.desired
            clock.advance(30)
        assert acted == 3

    def test_missing_signal_freezes_the_count(self) -> None:
        """No reading never scales to MIN or MAX: the count stays and the reason says why."""
        s = _scaler(FakeClock())
        d = s.decide(3, None, 0.6, signal_name="p95 latency ms")
        assert (d.desired, d.acted) == (3, False)
        assert "unavailable" in d.reason and "frozen" in d.reason

    def test_forecast_is_a_floor(self) -> None:
        """desired = max(reactive, forecast): a quiet signal with a forecast peak keeps the replicas."""
        clock = FakeClock()
        s = _scaler(clock, stabilization_s=0.0, cooldown_s=0.0)
        d = s.decide(2, 0.1, 0.6, forecast_replicas=5)
        assert (d.desired, d.acted) == (5, True)
        clock.advance(100)
        d = s.decide(5, 0.1, 0.6, forecast_replicas=5)
        assert d.desired == 5 and not d.acted
