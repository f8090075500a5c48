"""Load forecasts: Holt's linear trend, Holt-Winters with a daily season, and the error of past forecasts."""

from __future__ import annotations

import math

import numpy as np
import pytest

from coordinator.adaptor.forecast import HistorySnapshot, LoadHistory, forecast_series, holt_linear


def _daily(hours: int, start: int = 0) -> np.ndarray:
    """A request load with a daily cycle: 20 at night, 180 at the 14:00 peak (hourly buckets)."""
    t = np.arange(start, start + hours)
    return 100.0 + 80.0 * np.sin(2 * math.pi * (t - 8) / 24)


class TestForecastSeries:
    def test_holt_follows_a_linear_trend(self) -> None:
        """On a straight line, Holt's method continues the line."""
        y = np.arange(10, dtype=float) * 2.0 + 5.0
        f, _ = holt_linear(y, 3, 0.5, 0.1)
        assert np.allclose(f, [25.0, 27.0, 29.0], atol=1e-6)

    def test_holt_winters_forecasts_the_daily_peak_ahead(self) -> None:
        """With three days of history ending at 09:00, the forecast for 14:00 is the peak, not 09:00's level."""
        history = _daily(24 * 3 + 9)
        f, model = forecast_series(history, 6, 24)
        actual = _daily(6, start=24 * 3 + 9)
        assert model == "holt-winters"
        assert f.max() > history[-1] * 1.4
        assert abs(f.max() - actual.max()) / actual.max() < 0.05

    def test_model_depends_on_history_length(self) -> None:
        """Holt before two seasons, the last value before three points, nothing with no data."""
        assert forecast_series(_daily(30), 2, 24)[1] == "holt"
        assert forecast_series(np.array([3.0, 4.0]), 2, 24)[1] == "last"
        assert forecast_series(np.array([]), 2, 24)[1] == "none"

    def test_forecasts_are_never_negative(self) -> None:
        """A falling trend is cut at zero."""
        f, _ = forecast_series(np.array([30.0, 20.0, 10.0, 0.0]), 5, 24)
        assert (f >= 0).all()


class TestLoadHistory:
    def test_peak_within_the_lead_time(self) -> None:
        """The forecast is the highest load over the lead time, from bucketed samples."""
        h = LoadHistory(bucket_s=3600.0, season_buckets=24)
        for hour, load in enumerate(_daily(24 * 3 + 9)):
            h.add(hour * 3600.0, float(load))
            h.add(hour * 3600.0 + 1800.0, float(load))
        now = (24 * 3 + 9) * 3600.0 - 1.0
        f = h.forecast(now, lead_s=5 * 3600.0)
        assert f.model == "holt-winters"
        assert f.peak > 150.0

    def test_mape_scores_past_forecasts(self) -> None:
        """MAPE is unknown without scored forecasts, small on a regular series, and ignores bad samples."""
        h = LoadHistory(bucket_s=3600.0, season_buckets=24)
        assert math.isnan(h.mape)
        for hour, load in enumerate(_daily(24 * 4)):
            h.add(hour * 3600.0, float(load))
            h.add(hour * 3600.0 + 10.0, float("nan"))
        assert 0.0 <= h.mape < 15.0

    def test_the_filling_bucket_corrects_the_forecast(self) -> None:
        """A load that drops within the current bucket lowers the forecast within it, not a bucket later."""
        h = LoadHistory(bucket_s=60.0, season_buckets=1440)
        for minute in range(30):
            h.add(minute * 60.0, 100.0)
        before = h.forecast(30 * 60.0 - 1, lead_s=30.0).peak
        for second in range(0, 50, 5):         # a new bucket, far below what the model expects
            h.add(30 * 60.0 + second, 10.0)
        after = h.forecast(30 * 60.0 + 54, lead_s=30.0).peak
        assert before == pytest.approx(100.0, rel=0.05)
        assert after == pytest.approx(10.0 + 90.0 * 6 / 60, abs=1.0)   # 90 % of the bucket: 90 % corrected


def _hourly(hours: int) -> LoadHistory:
    """A history of ``hours`` hourly buckets of the daily load, plus the first sample of the next hour."""
    h = LoadHistory(bucket_s=3600.0, season_buckets=24)
    for hour, load in enumerate(_daily(hours + 1)):
        h.add(hour * 3600.0, float(load))
    return h


class TestSnapshotRestore:
    def test_a_restored_history_forecasts_and_scores_like_the_original(self) -> None:
        """Restored in the bucket after its last one and fed the same samples, a history gives the same
        forecast, model and MAPE as the one it was taken from."""
        first = _hourly(24 * 2 + 5)
        now = (24 * 2 + 5) * 3600.0
        snap = first.snapshot()
        assert snap.last_bucket == 24 * 2 + 4 and len(snap.values) == 24 * 2 + 5 and snap.errors
        second = LoadHistory(bucket_s=3600.0, season_buckets=24)
        second.restore(snap, now)
        second.add(now, float(_daily(24 * 2 + 6)[-1]))     # the sample the first one has of this hour
        for hour in range(24 * 2 + 6, 24 * 3 + 2):
            for h in (first, second):
                h.add(hour * 3600.0, float(_daily(hour + 1)[-1]))
        end = (24 * 3 + 2) * 3600.0 + 600.0
        a, b = first.forecast(end, lead_s=7200.0), second.forecast(end, lead_s=7200.0)
        assert a.model == b.model == "holt-winters"
        assert a.peak == pytest.approx(b.peak, rel=1e-12) and a.mape == pytest.approx(b.mape, rel=1e-12)
        assert first.snapshot() == second.snapshot()

    def test_missed_buckets_carry_the_last_value_up_to_a_season(self) -> None:
        """Three buckets missed at the leader change are filled with the last value and the next bucket is
        forecast (its error is scored); more than a season missed is refused."""
        snap = _hourly(30).snapshot()
        h = LoadHistory(bucket_s=3600.0, season_buckets=24)
        now = (snap.last_bucket + 4) * 3600.0 + 10.0
        h.restore(snap, now)
        restored = h.snapshot()
        assert restored.values == snap.values + (snap.values[-1],) * 3
        assert restored.last_bucket == snap.last_bucket + 3
        h.add(now, 50.0)
        h.add(now + 3600.0, 50.0)                       # closes the bucket forecast at restore: scored
        assert h.snapshot().errors[-1][0] == now + 3600.0
        with pytest.raises(ValueError, match="more than a season"):
            LoadHistory(bucket_s=3600.0, season_buckets=24).restore(snap, (snap.last_bucket + 26) * 3600.0)

    @pytest.mark.parametrize(("change", "reason"), [
        ({"bucket_s": 60.0}, "bucket_s"),
        ({"values": (1.0,) * (24 * 3 + 1)}, "values; at most"),
        ({"values": (1.0, math.nan)}, "finite"),
        ({"values": (1.0, -2.0)}, "finite"),
        ({"values": (1.0, math.inf)}, "finite"),
        ({"errors": ((0.0, 0.1),) * 26}, "scored errors"),
        ({"errors": ((0.0, -0.1),)}, "scored error"),
        ({"errors": ((1e12, 0.1),)}, "past time"),
        ({"last_bucket": 40}, "not before now"),
        ({"last_bucket": 10**9}, "not before now"),
    ])
    def test_a_snapshot_that_does_not_fit_is_refused_and_changes_nothing(self, change: dict, reason: str) -> None:
        """Another bucket size, too many values or errors, a value or error out of range, an error timed in the
        future, or a last bucket not before now's: refused naming why, the history left empty."""
        base = _hourly(30).snapshot()
        snap = HistorySnapshot(**{**{"bucket_s": base.bucket_s, "last_bucket": base.last_bucket,
                                     "values": base.values, "errors": base.errors}, **change})
        h = LoadHistory(bucket_s=3600.0, season_buckets=24, mape_window_s=86_400.0)
        with pytest.raises(ValueError, match=reason):
            h.restore(snap, 40 * 3600.0 + 5.0)
        assert len(h) == 0 and h.forecast(40 * 3600.0 + 5.0, 3600.0).model == "none"
