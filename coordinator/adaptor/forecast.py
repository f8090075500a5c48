"""Load forecasts for services: Holt's linear trend, and Holt-Winters (additive, daily season) once two days exist.

Both are the textbook exponential-smoothing recursions (Hyndman & Athanasopoulos, *Forecasting:
Principles and Practice*, §8.2 and §8.3), written over numpy arrays; the smoothing constants are
chosen per refit from a small grid by the one-step-ahead squared error. statsmodels'
``ExponentialSmoothing`` computes the same forecasts, but brings scipy, pandas and patsy into the
coordinator and runs a numerical optimizer at every refit, for two recursions of a few lines.

:class:`LoadHistory` keeps one service's load (requests running + waiting, or the busy GPU fraction)
in fixed buckets, forecasts the highest load within a lead time, and scores its own past forecasts
(MAPE over the last day). :meth:`LoadHistory.snapshot` and :meth:`LoadHistory.restore` carry it to a
new leader (stored at ``service-history/<id>``).

Example::

    hist = LoadHistory(bucket_s=60, season_buckets=1440)
    hist.add(now, load)                         # every controller tick
    f = hist.forecast(now, lead_s=90)           # Forecast(peak=…, model='holt', mape=…)
    snap = hist.snapshot()                      # HistorySnapshot: closed buckets and scored errors
    LoadHistory(bucket_s=60, season_buckets=1440).restore(snap, now)   # ValueError: refused, left empty
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from dataclasses import dataclass

import numpy as np

__all__ = ["Forecast", "HistorySnapshot", "LoadHistory", "forecast_series", "holt_linear", "holt_winters_additive"]

_ALPHAS = (0.2, 0.5, 0.8)
_BETAS = (0.01, 0.1)
_GAMMAS = (0.05, 0.3)


def holt_linear(y: np.ndarray, horizon: int, alpha: float, beta: float) -> tuple[np.ndarray, float]:
    """Holt's linear trend: forecasts 1..``horizon`` steps after ``y`` and the one-step squared error.

    :param y: at least 2 observations, oldest first.
    """
    level, trend = float(y[0]), float(y[1] - y[0])
    sse = 0.0
    for x in y[1:]:
        pred = level + trend
        sse += (x - pred) ** 2
        new_level = alpha * x + (1 - alpha) * pred
        trend = beta * (new_level - level) + (1 - beta) * trend
        level = new_level
    steps = np.arange(1, horizon + 1, dtype=float)
    return level + steps * trend, sse


def holt_winters_additive(y: np.ndarray, horizon: int, season: int, alpha: float, beta: float,
                          gamma: float) -> tuple[np.ndarray, float]:
    """Holt-Winters with additive seasonality of period ``season``.

    :param y: at least two full seasons, oldest first.
    :returns: forecasts 1..``horizon`` steps after ``y`` and the one-step squared error.
    """
    first, second = y[:season], y[season:2 * season]
    level = float(first.mean())
    trend = float((second.mean() - first.mean()) / season)
    seasonal = list(first - level)
    sse = 0.0
    for t in range(season, len(y)):
        s = seasonal[t - season]
        pred = level + trend + s
        sse += (y[t] - pred) ** 2
        new_level = alpha * (y[t] - s) + (1 - alpha) * (level + trend)
        trend = beta * (new_level - level) + (1 - beta) * trend
        seasonal.append(gamma * (y[t] - new_level) + (1 - gamma) * s)
        level = new_level
    n = len(y)
    out = np.empty(horizon)
    for h in range(1, horizon + 1):
        out[h - 1] = level + h * trend + seasonal[n - season + (h - 1) % season]
    return out, sse


def forecast_series(y: np.ndarray, horizon: int, season: int) -> tuple[np.ndarray, str]:
    """Forecasts 1..``horizon`` steps ahead, with the model used.

    Holt-Winters once ``y`` holds two seasons, Holt's linear trend from 3 points, the last value before.
    Negative forecasts (a falling trend) are cut at 0.

    :returns: ``(forecasts, model)``; model is ``holt-winters``, ``holt``, ``last`` or ``none`` (no data).
    """
    horizon = max(1, horizon)
    if len(y) == 0:
        return np.zeros(horizon), "none"
    if season >= 2 and len(y) >= 2 * season:
        best = min((holt_winters_additive(y, horizon, season, a, b, g)
                    for a, b, g in itertools.product(_ALPHAS, _BETAS, _GAMMAS)), key=lambda r: r[1])
        return np.maximum(best[0], 0.0), "holt-winters"
    if len(y) >= 3:
        best = min((holt_linear(y, horizon, a, b) for a, b in itertools.product(_ALPHAS, _BETAS)),
                   key=lambda r: r[1])
        return np.maximum(best[0], 0.0), "holt"
    return np.full(horizon, float(y[-1])), "last"


@dataclass(frozen=True, slots=True)
class Forecast:
    """The highest load forecast within the lead time, the model, and the past forecasts' error.

    :param peak: highest forecast load over the next ``lead_s`` (0 with no history).
    :param model: ``holt-winters``, ``holt``, ``last`` or ``none``.
    :param mape: mean absolute percentage error (%) of the one-bucket-ahead forecasts of the last day; NaN none.
    """

    peak: float
    model: str
    mape: float


@dataclass(frozen=True, slots=True)
class HistorySnapshot:
    """What a new leader needs to continue a :class:`LoadHistory`.

    :param bucket_s: seconds per bucket.
    :param last_bucket: index (``int(unix_s // bucket_s)``) of the last closed bucket; -1 when none closed.
    :param values: the closed buckets' mean load, oldest first.
    :param errors: ``(time, absolute percentage error as a fraction)`` of the scored forecasts, oldest first.
    """

    bucket_s: float
    last_bucket: int
    values: tuple[float, ...]
    errors: tuple[tuple[float, float], ...]


class LoadHistory:
    """One service's load in buckets, its forecasts and their error.

    :param bucket_s: seconds per bucket (a bucket's load is the mean of its samples).
    :param season_buckets: buckets per season (a day by default).
    :param seasons_kept: seasons of buckets kept.
    :param mape_window_s: how far back forecasts are scored.
    """

    def __init__(self, bucket_s: float = 60.0, season_buckets: int = 1440, seasons_kept: int = 3,
                 mape_window_s: float = 86_400.0) -> None:
        if bucket_s <= 0 or season_buckets < 1:
            raise ValueError("bucket_s and season_buckets must be positive")
        self.bucket_s, self.season = bucket_s, season_buckets
        self._values: deque[float] = deque(maxlen=season_buckets * seasons_kept)
        self._bucket = -1
        self._last_closed = -1
        self._sum, self._count = 0.0, 0
        self._pending: dict[int, float] = {}            # bucket → its one-bucket-ahead forecast
        self._errors: deque[tuple[float, float]] = deque()   # (time, absolute percentage error)
        self._mape_window_s = mape_window_s
        self._closed = 0
        self._horizon = 1
        self._cached: tuple[int, int, Forecast] | None = None

    def __len__(self) -> int:
        return len(self._values)

    @property
    def closed(self) -> int:
        """Buckets closed since this history was made (a restore counts as one)."""
        return self._closed

    @property
    def max_errors(self) -> int:
        """The most scored forecasts the MAPE window can hold (one per closed bucket)."""
        return math.ceil(self._mape_window_s / self.bucket_s) + 1

    def snapshot(self) -> HistorySnapshot:
        """The closed buckets and the scored errors (the bucket still filling is left out)."""
        return HistorySnapshot(self.bucket_s, self._last_closed, tuple(self._values), tuple(self._errors))

    def restore(self, snap: HistorySnapshot, now: float) -> None:
        """Continue from ``snap`` (read from etcd: untrusted), at Unix time ``now``.

        Buckets between the snapshot's last one and now (the leader change) get the last value when they
        are at most one season (a leader change loses a few buckets); after a longer gap the history starts
        empty, as most of a season would be made up. The next bucket's forecast is computed again, so the
        forecasts' scoring goes on.

        :raises ValueError: refused, naming why (the history is left as it was): another bucket size, more
            values than are kept or errors than the MAPE window holds, a value or error that is not finite
            and non-negative, an error timed after now, a last bucket not before now's, a gap longer than a season.
        """
        now_bucket = int(now // self.bucket_s)
        maxlen = self._values.maxlen or 0
        if snap.bucket_s != self.bucket_s:
            raise ValueError(f"bucket_s {snap.bucket_s} is not this controller's {self.bucket_s}")
        if len(snap.values) > maxlen:
            raise ValueError(f"{len(snap.values)} values; at most {maxlen} are kept")
        if len(snap.errors) > self.max_errors:
            raise ValueError(f"{len(snap.errors)} scored errors; at most {self.max_errors}")
        if not all(math.isfinite(v) and v >= 0 for v in snap.values):
            raise ValueError("a value is not a finite non-negative number")
        if not all(math.isfinite(t) and t <= now + self.bucket_s and math.isfinite(e) and e >= 0
                   for t, e in snap.errors):
            raise ValueError("a scored error is not a finite non-negative number at a past time")
        if not snap.values:
            return
        if snap.last_bucket >= now_bucket:
            raise ValueError(f"last bucket {snap.last_bucket} is not before now's ({now_bucket})")
        gap = now_bucket - snap.last_bucket - 1
        if gap > self.season:
            raise ValueError(f"{gap} buckets missed, more than a season ({self.season})")
        self._values.clear()
        self._values.extend(snap.values)
        self._values.extend(itertools.repeat(snap.values[-1], gap))
        self._errors = deque(sorted(e for e in snap.errors if e[0] >= now - self._mape_window_s))
        self._last_closed, self._bucket = now_bucket - 1, now_bucket
        self._sum, self._count = 0.0, 0
        self._closed += 1
        path, model = forecast_series(np.fromiter(self._values, float), self._horizon, self.season)
        self._pending = {now_bucket: float(path[0])}
        self._cached = (self._closed, self._horizon, Forecast(float(path.max()), model, math.nan))

    def add(self, now: float, load: float) -> None:
        """One load sample (non-finite or negative samples are ignored)."""
        if not math.isfinite(load) or load < 0:
            return
        bucket = int(now // self.bucket_s)
        if bucket != self._bucket and self._count:
            self._close(now)
        if bucket != self._bucket:
            self._bucket, self._sum, self._count = bucket, 0.0, 0
        self._sum += load
        self._count += 1

    def _close(self, now: float) -> None:
        actual = self._sum / self._count
        predicted = self._pending.pop(self._bucket, None)
        if predicted is not None and actual > 0:
            self._errors.append((now, abs(predicted - actual) / actual))
        while self._errors and self._errors[0][0] < now - self._mape_window_s:
            self._errors.popleft()
        self._values.append(actual)
        self._last_closed = self._bucket
        self._closed += 1
        # One refit per bucket: its path scores the model on the next bucket and answers forecast() until
        # the next bucket closes (forecasts for buckets that got no sample are dropped).
        path, model = forecast_series(np.fromiter(self._values, float), self._horizon, self.season)
        self._pending = {b: v for b, v in self._pending.items() if b > self._bucket}
        self._pending[self._bucket + 1] = float(path[0])
        self._cached = (self._closed, self._horizon, Forecast(float(path.max()), model, math.nan))

    @property
    def mape(self) -> float:
        """Mean absolute percentage error (%) of the scored forecasts of the last day; NaN when none."""
        if not self._errors:
            return math.nan
        return 100.0 * sum(e for _, e in self._errors) / len(self._errors)

    def forecast(self, now: float, lead_s: float) -> Forecast:
        """The highest load expected over the next ``lead_s`` seconds (at least one bucket ahead).

        The model is fitted on the closed buckets; the bucket still filling corrects it: the forecast path
        moves by how far that bucket's mean so far is from what the model predicted for it, weighted by
        the part of the bucket that has passed (an O(1) level correction, so a load that dropped or jumped
        shows within the bucket, not a bucket later).
        """
        horizon = max(1, math.ceil(lead_s / self.bucket_s))
        self._horizon = horizon
        if self._closed and self._cached is not None and self._cached[:2] == (self._closed, horizon):
            f = self._cached[2]
        else:
            values = np.fromiter(self._values, float)
            if len(values) == 0 and self._count:
                values = np.array([self._sum / self._count])
            path, model = forecast_series(values, horizon, self.season)
            f = Forecast(float(path.max()), model, math.nan)
            if self._closed:
                self._cached = (self._closed, horizon, f)
        peak = f.peak
        predicted = self._pending.get(self._bucket)
        if self._count and predicted is not None:
            # Weighted by how much of the bucket has passed: its first samples are noisy.
            filled = min(1.0, max(0.0, now / self.bucket_s - self._bucket))
            peak = max(0.0, peak + filled * (self._sum / self._count - predicted))
        return Forecast(peak, f.model, self.mape)
