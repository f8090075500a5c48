"""Pure part of the task-metrics collector: exposition text → snapshot → QoS figures.

The text is parsed by prometheus-client's own parser; nothing here touches the network or
a clock, so every derivation is tested on literal exposition text.

Derivations over a window of snapshots (oldest first, the newest is "now"):

- p95 of a histogram: the per-bucket increase between the oldest and the newest snapshot,
  then Prometheus' ``histogram_quantile`` (linear interpolation inside the bucket holding
  the rank; the highest finite bound when the rank falls in ``+Inf``). No request finished
  in the window: no value, not zero.
- tokens/s: the counter's increase over the window's duration.
- requests running and waiting: the newest gauges.

A counter or bucket that goes down means the server restarted; the window restarts from
that snapshot (:class:`QosWindow`), as Prometheus' ``rate`` treats a reset.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from common.qos import MetricNames

__all__ = [
    "Histogram",
    "MalformedMetrics",
    "MetricsSnapshot",
    "QosFigures",
    "QosWindow",
    "derive_qos",
    "histogram_quantile",
    "parse_metrics",
]

P95 = 0.95


class MalformedMetrics(ValueError):
    """The exposition text cannot be parsed, or carries none of the names asked for."""


@dataclass(frozen=True, slots=True)
class Histogram:
    """Cumulative bucket counts, summed over every label set but ``le``.

    :param bounds: upper bounds, ascending, the last one ``+Inf``.
    :param counts: cumulative counts per bound (non-decreasing).
    """

    bounds: tuple[float, ...]
    counts: tuple[float, ...]

    @property
    def total(self) -> float:
        """Observations so far (the ``+Inf`` bucket)."""
        return self.counts[-1]


@dataclass(frozen=True, slots=True)
class MetricsSnapshot:
    """The mapped metrics of one scrape; None where the exposition lacks a metric.

    :param time_s: when the scrape ended (monotonic seconds).
    """

    time_s: float
    latency: Histogram | None = None
    ttft: Histogram | None = None
    tokens: float | None = None
    running: float | None = None
    waiting: float | None = None


@dataclass(frozen=True, slots=True)
class QosFigures:
    """What a window of snapshots says; None where it cannot be derived."""

    latency_p95_s: float | None = None
    ttft_p95_s: float | None = None
    tokens_per_s: float | None = None
    requests_running: float | None = None
    requests_waiting: float | None = None
    window_s: float = 0.0


def _finite(value: float) -> bool:
    return math.isfinite(value) and value >= 0


def _histogram(buckets: dict[float, float]) -> Histogram | None:
    """Buckets by bound → a :class:`Histogram`; None without a ``+Inf`` bucket (not a valid histogram)."""
    if math.inf not in buckets:
        return None
    bounds = tuple(sorted(buckets))
    counts: list[float] = []
    for b in bounds:
        # Cumulative counts never fall; a server that sends them out of order is read as if it had not.
        counts.append(max(buckets[b], counts[-1] if counts else 0.0))
    return Histogram(bounds, tuple(counts))


def parse_metrics(text: str, names: MetricNames, time_s: float) -> MetricsSnapshot:
    """Read the mapped metrics out of Prometheus text exposition.

    Series of one metric with different labels (vLLM labels each series with its model) are
    summed. A counter matches ``<name>`` or ``<name>_total``; a histogram is read from its
    ``<name>_bucket`` series.

    :param text: the exposition (text format 0.0.4).
    :param names: which metric plays which role.
    :param time_s: the snapshot's time.
    :returns: the snapshot.
    :raises MalformedMetrics: when the text does not parse, or has none of the mapped metrics.
    """
    wanted_hist = {f"{n}_bucket": role for role, n in (("latency", names.latency_histogram),
                                                       ("ttft", names.ttft_histogram)) if n}
    wanted_value = {}
    for role, n in (("tokens", names.tokens_counter), ("running", names.running_gauge),
                    ("waiting", names.waiting_gauge)):
        if n:
            wanted_value[n] = role
            if role == "tokens" and not n.endswith("_total"):
                wanted_value[f"{n}_total"] = role
    buckets: dict[str, dict[float, float]] = {}
    values: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                _take(sample, wanted_hist, wanted_value, buckets, values)
    except MalformedMetrics:
        raise
    except Exception as e:  # the parser raises ValueError, IndexError, KeyError... on bad text
        raise MalformedMetrics(f"malformed exposition: {type(e).__name__}: {str(e)[:120]}") from e
    hist = {role: _histogram(b) for role, b in buckets.items()}
    snapshot = MetricsSnapshot(time_s, latency=hist.get("latency"), ttft=hist.get("ttft"),
                               tokens=values.get("tokens"), running=values.get("running"),
                               waiting=values.get("waiting"))
    if not (hist or values) and names.names():
        raise MalformedMetrics(f"none of {', '.join(names.names())} in the exposition")
    return snapshot


def _take(sample: Sample, wanted_hist: dict[str, str], wanted_value: dict[str, str],
          buckets: dict[str, dict[float, float]], values: dict[str, float]) -> None:
    """File one parsed sample under its role, if it has one."""
    name, labels, value = sample.name, sample.labels, sample.value
    role = wanted_hist.get(name)
    if role is not None:
        try:
            bound = float(labels["le"])
        except (KeyError, ValueError):
            raise MalformedMetrics(f"{name} has a series without a numeric le label") from None
        if _finite(value) and not math.isnan(bound):
            per_role = buckets.setdefault(role, {})
            per_role[bound] = per_role.get(bound, 0.0) + value
        return
    role = wanted_value.get(name)
    if role is not None and _finite(value):
        values[role] = values.get(role, 0.0) + value


def histogram_quantile(q: float, bounds: Sequence[float], counts: Sequence[float]) -> float | None:
    """Prometheus' ``histogram_quantile`` over cumulative bucket counts.

    :param q: the quantile, 0 < q < 1.
    :param bounds: ascending upper bounds, the last ``+Inf``.
    :param counts: cumulative counts per bound.
    :returns: the estimate, or None when the histogram is empty.

    Example: bounds (0.1, 0.5, +Inf), counts (0, 10, 10): the p95 rank 9.5 falls in
    (0.1, 0.5] holding 10 observations, so 0.1 + 0.4 × 9.5/10 = 0.48.
    """
    total = counts[-1] if counts else 0.0
    if total <= 0:
        return None
    rank = q * total
    i = next(i for i, c in enumerate(counts) if c >= rank)
    if math.isinf(bounds[i]):
        return bounds[i - 1] if i > 0 else None
    if i == 0 and bounds[0] <= 0:
        return bounds[0]
    lower = bounds[i - 1] if i > 0 else 0.0
    below = counts[i - 1] if i > 0 else 0.0
    return lower + (bounds[i] - lower) * (rank - below) / (counts[i] - below)


def _increase(old: Histogram | None, new: Histogram | None) -> Histogram | None:
    """The buckets' increase from ``old`` to ``new``; None when either is missing or their bounds differ."""
    if old is None or new is None or old.bounds != new.bounds:
        return None
    return Histogram(new.bounds, tuple(max(0.0, n - o) for n, o in zip(new.counts, old.counts, strict=True)))


def _p95(old: Histogram | None, new: Histogram | None) -> float | None:
    delta = _increase(old, new)
    return None if delta is None else histogram_quantile(P95, delta.bounds, delta.counts)


def derive_qos(window: Sequence[MetricsSnapshot]) -> QosFigures:
    """The QoS figures of a window of snapshots (oldest first; one snapshot gives only the gauges).

    :param window: snapshots of one endpoint, oldest first, with no reset inside.
    :returns: the figures; percentiles and the rate cover ``window[0]`` to ``window[-1]``.
    """
    if not window:
        return QosFigures()
    old, new = window[0], window[-1]
    span = new.time_s - old.time_s
    tokens_per_s = None
    if span > 0 and old.tokens is not None and new.tokens is not None and new.tokens >= old.tokens:
        tokens_per_s = (new.tokens - old.tokens) / span
    return QosFigures(
        latency_p95_s=_p95(old.latency, new.latency) if span > 0 else None,
        ttft_p95_s=_p95(old.ttft, new.ttft) if span > 0 else None,
        tokens_per_s=tokens_per_s,
        requests_running=new.running,
        requests_waiting=new.waiting,
        window_s=max(0.0, span),
    )


def _went_down(old: MetricsSnapshot, new: MetricsSnapshot) -> bool:
    """True when a counter or histogram fell (the server restarted) or a histogram's buckets changed."""
    if old.tokens is not None and new.tokens is not None and new.tokens < old.tokens:
        return True
    for a, b in ((old.latency, new.latency), (old.ttft, new.ttft)):
        if a is not None and b is not None and (a.bounds != b.bounds or b.total < a.total):
            return True
    return False


class QosWindow:
    """The snapshots of one endpoint covering the last ``window_s`` seconds (plus the one just before).

    :param window_s: how far back the figures reach.
    :param max_snapshots: hard bound on what is kept, whatever the scrape rate.

    Example::

        window = QosWindow(30.0)
        window.add(parse_metrics(text, names, time_s=clock()))
        figures = window.figures()
    """

    def __init__(self, window_s: float, max_snapshots: int = 1024) -> None:
        if not window_s > 0:
            raise ValueError(f"window_s must be positive, got {window_s!r}")
        self.window_s = window_s
        self._snapshots: deque[MetricsSnapshot] = deque(maxlen=max(2, max_snapshots))

    def __len__(self) -> int:
        return len(self._snapshots)

    def add(self, snapshot: MetricsSnapshot) -> None:
        """Append a newer snapshot; after a reset the window restarts from it."""
        if self._snapshots and (snapshot.time_s <= self._snapshots[-1].time_s
                                or _went_down(self._snapshots[-1], snapshot)):
            self._snapshots.clear()
        self._snapshots.append(snapshot)
        # Keep the newest snapshot at least window_s old as the base, so the figures span the
        # whole window once it has filled; everything older goes.
        horizon = snapshot.time_s - self.window_s
        while len(self._snapshots) >= 2 and self._snapshots[1].time_s <= horizon:
            self._snapshots.popleft()

    def figures(self) -> QosFigures:
        """:func:`derive_qos` over the window."""
        return derive_qos(self._snapshots)

    def snapshots(self) -> Iterable[MetricsSnapshot]:
        """The snapshots kept, oldest first."""
        return tuple(self._snapshots)
