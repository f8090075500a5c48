"""Task metrics, pure part: exposition text → snapshot → p95, tokens/s and queue depth."""

from __future__ import annotations

import math

import pytest

from agent.collectors.task_metrics import (
    Histogram,
    MalformedMetrics,
    MetricsSnapshot,
    QosWindow,
    derive_qos,
    histogram_quantile,
    parse_metrics,
)
from common.qos import BUILTIN_MAPPINGS, MetricNames

VLLM = BUILTIN_MAPPINGS["vllm"]
TGI = BUILTIN_MAPPINGS["tgi"]
BOUNDS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0)


def vllm_text(e2e: dict[float, float], tokens: float, running: float = 3, waiting: float = 1,
              ttft: dict[float, float] | None = None, models: tuple[str, ...] = ("m",)) -> str:
    """A vLLM exposition with the given per-bound (non-cumulative) counts, repeated for each model label."""
    lines = ["# HELP vllm:e2e_request_latency_seconds Histogram of end to end request latency in seconds.",
             "# TYPE vllm:e2e_request_latency_seconds histogram"]
    for model in models:
        total = 0.0
        for bound in (*BOUNDS, math.inf):
            total += e2e.get(bound, 0.0)
            le = "+Inf" if math.isinf(bound) else repr(bound)
            lines.append(f'vllm:e2e_request_latency_seconds_bucket{{le="{le}",model_name="{model}"}} {total}')
        lines.append(f'vllm:e2e_request_latency_seconds_count{{model_name="{model}"}} {total}')
        lines.append(f'vllm:e2e_request_latency_seconds_sum{{model_name="{model}"}} 1.0')
    if ttft is not None:
        lines.append("# TYPE vllm:time_to_first_token_seconds histogram")
        total = 0.0
        for bound in (0.01, 0.05, 0.1, math.inf):
            total += ttft.get(bound, 0.0)
            le = "+Inf" if math.isinf(bound) else repr(bound)
            lines.append(f'vllm:time_to_first_token_seconds_bucket{{le="{le}",model_name="m"}} {total}')
    lines += ["# TYPE vllm:generation_tokens_total counter",
              *(f'vllm:generation_tokens_total{{model_name="{m}"}} {tokens}' for m in models),
              "# TYPE vllm:num_requests_running gauge",
              *(f'vllm:num_requests_running{{model_name="{m}"}} {running}' for m in models),
              "# TYPE vllm:num_requests_waiting gauge",
              *(f'vllm:num_requests_waiting{{model_name="{m}"}} {waiting}' for m in models),
              "# TYPE vllm:gpu_cache_usage_perc gauge",
              'vllm:gpu_cache_usage_perc{model_name="m"} 0.4']
    return "\n".join(lines) + "\n"


TGI_TEXT = """\
# TYPE tgi_request_duration histogram
tgi_request_duration_bucket{le="0.1"} 2
tgi_request_duration_bucket{le="1"} 10
tgi_request_duration_bucket{le="+Inf"} 10
tgi_request_duration_sum 4.2
tgi_request_duration_count 10
# TYPE tgi_request_generated_tokens histogram
tgi_request_generated_tokens_bucket{le="100"} 10
tgi_request_generated_tokens_bucket{le="+Inf"} 10
tgi_request_generated_tokens_sum 640
tgi_request_generated_tokens_count 10
# TYPE tgi_queue_size gauge
tgi_queue_size 4
# TYPE tgi_batch_current_size gauge
tgi_batch_current_size 6
"""


class TestParseMetrics:
    """prometheus-client's parser reads the mapped metrics out of an exposition."""

    def test_vllm_exposition(self) -> None:
        """Buckets, the tokens counter and the gauges land in their roles; other metrics are ignored."""
        snap = parse_metrics(vllm_text({0.5: 4, 1.0: 1}, tokens=640, ttft={0.05: 5}), VLLM, time_s=7.0)
        assert snap.time_s == 7.0
        assert snap.latency == Histogram((*BOUNDS, math.inf), (0, 4, 4, 5, 5, 5, 5, 5, 5))
        assert snap.ttft == Histogram((0.01, 0.05, 0.1, math.inf), (0, 5, 5, 5))
        assert (snap.tokens, snap.running, snap.waiting) == (640, 3, 1)

    def test_series_of_several_models_are_summed(self) -> None:
        """Series that differ only in labels other than le are added together."""
        snap = parse_metrics(vllm_text({0.5: 2}, tokens=10, running=1, waiting=2, models=("a", "b")), VLLM, 0.0)
        assert snap.latency is not None and snap.latency.total == 4
        assert (snap.tokens, snap.running, snap.waiting) == (20, 2, 4)

    def test_tgi_exposition(self) -> None:
        """TGI's names: tokens from the generated-tokens histogram's sum; no time-to-first-token."""
        snap = parse_metrics(TGI_TEXT, TGI, 0.0)
        assert snap.latency == Histogram((0.1, 1.0, math.inf), (2, 10, 10))
        assert snap.ttft is None
        assert (snap.tokens, snap.running, snap.waiting) == (640, 6, 4)

    def test_custom_names_and_untyped_counter(self) -> None:
        """A counter named without _total matches its _total series; untyped series are read too."""
        names = MetricNames(tokens_counter="my_tokens", waiting_gauge="my_queue")
        snap = parse_metrics("my_tokens_total 12\nmy_queue 3\n", names, 0.0)
        assert (snap.tokens, snap.waiting, snap.latency, snap.running) == (12, 3, None, None)

    def test_histogram_without_inf_bucket_is_not_read(self) -> None:
        """A histogram lacking its +Inf bucket gives no latency (it is not a valid histogram)."""
        text = 'vllm:e2e_request_latency_seconds_bucket{le="0.5"} 3\nvllm:num_requests_running 1\n'
        snap = parse_metrics(text, VLLM, 0.0)
        assert snap.latency is None and snap.running == 1

    def test_non_finite_and_negative_values_are_skipped(self) -> None:
        """NaN, infinite and negative sample values are not taken."""
        text = "vllm:num_requests_running NaN\nvllm:num_requests_waiting -4\nvllm:generation_tokens_total +Inf\n" \
               "vllm:gpu_cache_usage_perc 1\nvllm:num_requests_running 2\n"
        snap = parse_metrics(text, VLLM, 0.0)
        assert (snap.running, snap.waiting, snap.tokens) == (2, None, None)

    @pytest.mark.parametrize("text", [
        "this is { not an exposition\n",
        'vllm:num_requests_running{model_name="m} 1\n',
        "vllm:num_requests_running one\n",
        'vllm:e2e_request_latency_seconds_bucket{le="fast"} 1\n',
    ])
    def test_malformed_text_is_refused(self, text: str) -> None:
        """Text the parser rejects, or a bucket whose le is not a number, raises MalformedMetrics."""
        with pytest.raises(MalformedMetrics):
            parse_metrics(text, VLLM, 0.0)

    def test_none_of_the_names_is_refused(self) -> None:
        """An exposition with none of the mapped metrics (wrong flavour) is refused, naming them."""
        with pytest.raises(MalformedMetrics, match="vllm:num_requests_running"):
            parse_metrics(TGI_TEXT, VLLM, 0.0)


class TestHistogramQuantile:
    """Prometheus' histogram_quantile over cumulative counts."""

    @pytest.mark.parametrize(("bounds", "counts", "expected"), [
        # rank 0.95 × 10 = 9.5 in (0.1, 0.5] holding 10: 0.1 + 0.4 × 9.5/10 = 0.48
        ((0.1, 0.5, math.inf), (0, 10, 10), 0.48),
        # rank 0.95 × 100 = 95 in (0.5, 1.0] holding 90..100: 0.5 + 0.5 × (95 − 90)/10 = 0.75
        ((0.5, 1.0, math.inf), (90, 100, 100), 0.75),
        # rank 95 in the first bucket (0, 0.2] holding 100: 0.2 × 95/100 = 0.19
        ((0.2, math.inf), (100, 100), 0.19),
        # rank 9.5 falls in +Inf (only 5 of 10 ≤ 2.0): the highest finite bound, 2.0
        ((1.0, 2.0, math.inf), (2, 5, 10), 2.0),
    ])
    def test_table(self, bounds: tuple[float, ...], counts: tuple[float, ...], expected: float) -> None:
        """The estimate interpolates linearly within the bucket that holds the rank."""
        assert histogram_quantile(0.95, bounds, counts) == pytest.approx(expected)

    def test_empty_histogram(self) -> None:
        """No observations: no estimate."""
        assert histogram_quantile(0.95, (0.5, math.inf), (0, 0)) is None


def snap(t: float, e2e: dict[float, float], tokens: float, **kw: float) -> MetricsSnapshot:
    return parse_metrics(vllm_text(e2e, tokens, **kw), VLLM, t)


class TestDeriveQos:
    """Figures over a window come from the increase between its oldest and newest snapshot."""

    def test_p95_from_bucket_deltas_not_totals(self) -> None:
        """Old fast requests before the window do not dilute the p95 of the slow ones inside it."""
        old = snap(0.0, {0.3: 1000}, tokens=1000)
        new = snap(10.0, {0.3: 1000, 2.0: 20}, tokens=1640)
        f = derive_qos([old, new])
        # The 20 new requests all fall in (1.5, 2.0]: rank 19 → 1.5 + 0.5 × 19/20 = 1.975.
        assert f.latency_p95_s == pytest.approx(1.975)
        assert f.tokens_per_s == pytest.approx(64.0)   # 640 tokens in 10 s
        assert (f.requests_running, f.requests_waiting, f.window_s) == (3, 1, 10.0)

    def test_no_request_in_window_gives_no_latency(self) -> None:
        """Unchanged buckets: latency unknown (None), not zero; the token rate is zero."""
        f = derive_qos([snap(0.0, {0.5: 5}, 100), snap(5.0, {0.5: 5}, 100)])
        assert f.latency_p95_s is None and f.tokens_per_s == 0.0

    def test_single_snapshot_gives_only_gauges(self) -> None:
        """The first scrape has no window: gauges only."""
        f = derive_qos([snap(0.0, {0.5: 5}, 100, running=2, waiting=7)])
        assert (f.latency_p95_s, f.ttft_p95_s, f.tokens_per_s) == (None, None, None)
        assert (f.requests_running, f.requests_waiting, f.window_s) == (2, 7, 0.0)

    def test_ttft_p95(self) -> None:
        """The time-to-first-token histogram gives its own p95."""
        old = snap(0.0, {}, 0, ttft={0.01: 10})
        new = snap(1.0, {}, 0, ttft={0.01: 10, 0.1: 10})
        # 10 new in (0.05, 0.1]: rank 9.5 → 0.05 + 0.05 × 9.5/10 = 0.0975
        assert derive_qos([old, new]).ttft_p95_s == pytest.approx(0.0975)


class TestQosWindow:
    """The window keeps what covers the last window_s seconds and restarts after a server restart."""

    def test_window_slides(self) -> None:
        """After the load changes, the p95 covers only the last window_s seconds once they have passed."""
        w = QosWindow(window_s=3.0)
        counts = {0.3: 0.0, 2.0: 0.0}
        for t in range(10):
            counts[0.3 if t < 5 else 2.0] += 10
            w.add(snap(float(t), dict(counts), tokens=t * 100.0))
        f = w.figures()
        assert f.window_s == 3.0
        assert 1.5 < f.latency_p95_s <= 2.0   # only slow requests in (6, 9]
        assert f.tokens_per_s == pytest.approx(100.0)
        assert len(w) == 4

    def test_counter_reset_restarts_the_window(self) -> None:
        """A counter that goes down (server restarted) drops the older snapshots instead of a negative rate."""
        w = QosWindow(window_s=60.0)
        w.add(snap(0.0, {0.5: 100}, tokens=5000))
        w.add(snap(1.0, {0.5: 2}, tokens=30))
        assert len(w) == 1
        w.add(snap(2.0, {0.5: 4}, tokens=94))
        f = w.figures()
        assert f.tokens_per_s == pytest.approx(64.0) and f.latency_p95_s is not None

    def test_bounded(self) -> None:
        """However fast snapshots come, at most max_snapshots are kept."""
        w = QosWindow(window_s=1e9, max_snapshots=5)
        for t in range(50):
            w.add(snap(float(t), {}, tokens=float(t)))
        assert len(w) == 5

    def test_invalid_window(self) -> None:
        """A non-positive window is refused."""
        with pytest.raises(ValueError):
            QosWindow(0.0)
