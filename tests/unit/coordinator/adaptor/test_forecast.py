"""Load forecasts: Holt's linear trend, Holt-Winters with a daily season, and the error of past forecasts."""

from __future__ import annotations

import math

import numpy as np
import pytest

from coordinator.adaptor.forecast import LoadHistory, forecast_series, holt_linear


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
