"""Inference tasks' own metrics: latency, time to first token, tokens/s and queue depth.

A task may declare a Prometheus endpoint (vLLM, TGI, or any server with a mapping). Each
tick this collector starts one scrape per such task on a small thread pool and returns at
once with the newest finished result, so a slow, hanging or huge endpoint never delays
the sampler: a scrape still running is not started again, and is reported unavailable
once it has taken longer than its timeout. The reading derived from a scrape is therefore
one tick old.

Each scrape has a socket timeout, an overall deadline and a response size limit. An
endpoint that cannot be read (refused, timed out, HTTP error, too large, unparsable, none
of the mapped metrics) yields a reading with ``metrics_unavailable`` set and no values;
the window of earlier snapshots is kept, so the figures resume when the endpoint answers.

Example::

    metrics = TaskMetricsCollector(runtime.metrics_targets, window_s=30.0)
    readings = metrics.collect()     # never blocks on the network
    metrics.close()
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import urlsplit

from agent.collectors._task_metrics_parse import (
    Histogram,
    MalformedMetrics,
    MetricsSnapshot,
    QosFigures,
    QosWindow,
    derive_qos,
    histogram_quantile,
    parse_metrics,
)
from agent.collectors.base import TaskQosReading
from common.errors import CollectorError
from common.qos import MetricNames, metric_names, metrics_url_problem

__all__ = [
    "NAME",
    "Histogram",
    "MalformedMetrics",
    "MetricsSnapshot",
    "MetricsTarget",
    "MetricsUnavailable",
    "QosFigures",
    "QosWindow",
    "TaskMetricsCollector",
    "TaskMetricsTargets",
    "derive_qos",
    "fetch_exposition",
    "histogram_quantile",
    "parse_metrics",
]

NAME = "task_metrics"
DEFAULT_TIMEOUT_S = 2.0
DEFAULT_MAX_BYTES = 4 * 1024 * 1024   # vLLM's exposition is tens of KiB; a runaway label set is not
_CHUNK = 64 * 1024
_MAX_REASON = 200


class MetricsUnavailable(CollectorError):
    """A task's metrics endpoint could not be read this time; the message is the reason."""


@dataclass(frozen=True, slots=True)
class MetricsTarget:
    """Where one task publishes its metrics and which names to read there.

    :param problem: why the declared endpoint cannot be scraped at all (reported as the
        reading's ``metrics_unavailable``, nothing is fetched); "" when it can.
    """

    url: str
    names: MetricNames
    problem: str = ""

    @classmethod
    def declared(cls, url: str, flavour: str, overrides: Mapping[str, str]) -> MetricsTarget:
        """The target a StartTask declares, checked: an unusable URL or mapping becomes ``problem``."""
        problem = metrics_url_problem(url)
        if problem is not None:
            return cls(url, MetricNames(), f"invalid metrics URL: {problem}")
        try:
            names = metric_names(flavour, overrides)
        except ValueError as e:
            return cls(url, MetricNames(), f"invalid metrics mapping: {e}")
        return cls(url, names)


TaskMetricsTargets = Callable[[], Mapping[str, MetricsTarget]]
"""Returns the metrics target of every running task that declared one, by task id."""


def _reason(error: BaseException, timeout_s: float) -> str:
    """A short reason for a failed scrape."""
    if isinstance(error, TimeoutError | socket.timeout):
        return f"no answer within {timeout_s:g}s"
    if isinstance(error, ConnectionRefusedError):
        return "connection refused"
    if isinstance(error, OSError):
        return error.strerror or str(error) or type(error).__name__
    return f"{type(error).__name__}: {error}"


def _abort(sock: socket.socket) -> None:
    """Deadline reached: shut the socket so that a read blocked on a trickling server returns."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def fetch_exposition(url: str, *, timeout_s: float = DEFAULT_TIMEOUT_S, max_bytes: int = DEFAULT_MAX_BYTES,
                     clock: Callable[[], float] = time.monotonic) -> str:
    """GET a Prometheus text exposition, within ``timeout_s`` and ``max_bytes``.

    The socket timeout bounds each read, and a timer shuts the socket down at the deadline,
    so a server sending one byte at a time cannot hold the request past ``timeout_s``.

    :param url: an http URL on a loopback address (checked again here).
    :param timeout_s: the deadline of the whole request.
    :param max_bytes: larger bodies are refused.
    :returns: the body as text.
    :raises MetricsUnavailable: with the reason, for any failure.
    """
    problem = metrics_url_problem(url)
    if problem is not None:
        raise MetricsUnavailable(f"invalid metrics URL: {problem}")
    parts = urlsplit(url)
    deadline = clock() + timeout_s
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port or 80, timeout=timeout_s)
    timer: threading.Timer | None = None
    resp: http.client.HTTPResponse | None = None
    try:
        conn.connect()
        # The socket itself, not conn.sock: the connection lets go of it once the response owns it.
        timer = threading.Timer(max(0.0, deadline - clock()), _abort, (conn.sock,))
        timer.daemon = True
        timer.start()
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        conn.request("GET", path, headers={"Accept": "text/plain;version=0.0.4", "Accept-Encoding": "identity",
                                           "User-Agent": "gptrm-agent"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise MetricsUnavailable(f"HTTP {resp.status} {resp.reason}"[:_MAX_REASON])
        length = resp.getheader("Content-Length")
        if length is not None and length.isdigit() and int(length) > max_bytes:
            raise MetricsUnavailable(f"response of {int(length)} bytes is over the {max_bytes}-byte limit")
        body = bytearray()
        while chunk := resp.read1(_CHUNK):
            body += chunk
            if len(body) > max_bytes:
                raise MetricsUnavailable(f"response over the {max_bytes}-byte limit")
        if clock() > deadline:
            raise MetricsUnavailable(f"response not complete within {timeout_s:g}s")
    except MetricsUnavailable:
        raise
    except (OSError, http.client.HTTPException) as e:
        if clock() > deadline:
            raise MetricsUnavailable(f"response not complete within {timeout_s:g}s") from e
        raise MetricsUnavailable(_reason(e, timeout_s)) from e
    finally:
        if timer is not None:
            timer.cancel()
        if resp is not None:
            resp.close()
        conn.close()
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise MetricsUnavailable("response is not UTF-8 text") from e


class _Task:
    """Scrape state of one task: its window, the scrape in flight, the latest reading."""

    __slots__ = ("future", "reading", "started", "target", "window")

    def __init__(self, target: MetricsTarget, window_s: float) -> None:
        self.target = target
        self.window = QosWindow(window_s)
        self.future: Future[tuple[MetricsSnapshot, float]] | None = None
        self.started = 0.0
        self.reading: TaskQosReading | None = None


class TaskMetricsCollector:
    """Scrapes every running task's declared metrics endpoint, off the sampler's thread.

    :param targets: the running tasks' endpoints, see :data:`TaskMetricsTargets`.
    :param window_s: the window of the percentiles and the rate.
    :param timeout_s: per-scrape timeout.
    :param max_bytes: per-scrape response limit.
    :param workers: scrapes that may run at once.
    :param fetch: ``url -> text`` (tests); :func:`fetch_exposition` with the limits above by default.
    :param now: wall clock for ``scraped_unix_s``. :param clock: monotonic clock.
    """

    name = NAME

    def __init__(self, targets: TaskMetricsTargets, *, window_s: float = 30.0,
                 timeout_s: float = DEFAULT_TIMEOUT_S, max_bytes: int = DEFAULT_MAX_BYTES, workers: int = 4,
                 fetch: Callable[[str], str] | None = None, now: Callable[[], float] = time.time,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not window_s > 0:
            raise ValueError(f"window_s must be positive, got {window_s!r}")
        self._targets = targets
        self._window_s = window_s
        self._timeout_s = timeout_s
        self._fetch = fetch or (lambda url: fetch_exposition(url, timeout_s=timeout_s, max_bytes=max_bytes,
                                                             clock=clock))
        self._now = now
        self._clock = clock
        self._pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="task-metrics")
        self._tasks: dict[str, _Task] = {}
        self._closed = threading.Event()

    def collect(self) -> list[TaskQosReading]:
        """Harvest finished scrapes, start the next ones, return the latest reading of each task.

        Never waits on the network.
        """
        targets = dict(self._targets())
        for task_id in list(self._tasks):
            if task_id not in targets:
                self._forget(task_id)
        readings = []
        for task_id, target in targets.items():
            state = self._tasks.get(task_id)
            if state is None or state.target != target:
                if state is not None:
                    self._forget(task_id)
                state = self._tasks[task_id] = _Task(target, self._window_s)
            self._step(task_id, state)
            if state.reading is not None:
                readings.append(state.reading)
        return readings

    def close(self) -> None:
        """Stop scraping; scrapes in flight end within their timeout, unwaited."""
        self._closed.set()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _forget(self, task_id: str) -> None:
        state = self._tasks.pop(task_id)
        if state.future is not None:
            state.future.cancel()

    def _step(self, task_id: str, state: _Task) -> None:
        """Harvest this task's scrape when it has finished, and start the next one."""
        if state.target.problem:
            state.reading = self._unavailable(task_id, state.target.problem)
            return
        future = state.future
        if future is not None and not future.done():
            waited = self._clock() - state.started
            if waited > self._timeout_s:
                state.reading = self._unavailable(task_id, f"scrape still running after {waited:.1f}s")
            return
        if future is not None:
            state.reading = self._harvest(task_id, state, future)
        if not self._closed.is_set():
            state.started = self._clock()
            state.future = self._pool.submit(self._scrape, state.target)

    def _scrape(self, target: MetricsTarget) -> tuple[MetricsSnapshot, float]:
        """Worker thread: fetch and parse one exposition; returns it with the wall time it ended."""
        text = self._fetch(target.url)
        return parse_metrics(text, target.names, self._clock()), self._now()

    def _harvest(self, task_id: str, state: _Task, future: Future[tuple[MetricsSnapshot, float]]) -> TaskQosReading:
        """The reading of a finished scrape: its figures over the window, or why it failed."""
        try:
            snapshot, scraped_unix_s = future.result()
        except (MetricsUnavailable, MalformedMetrics) as e:
            return self._unavailable(task_id, str(e))
        except Exception as e:  # a fetch or parser bug is this task's problem, never the sampler's
            return self._unavailable(task_id, _reason(e, self._timeout_s))
        state.window.add(snapshot)
        f = state.window.figures()
        return TaskQosReading(task_id, latency_p95_s=f.latency_p95_s, ttft_p95_s=f.ttft_p95_s,
                              tokens_per_s=f.tokens_per_s, requests_running=f.requests_running,
                              requests_waiting=f.requests_waiting, window_s=f.window_s, scraped_unix_s=scraped_unix_s)

    def _unavailable(self, task_id: str, reason: str) -> TaskQosReading:
        return TaskQosReading(task_id, metrics_unavailable=reason[:_MAX_REASON], scraped_unix_s=self._now())
