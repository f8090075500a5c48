"""The latest QoS reading of each inference task, from the task's own metrics via its agent.

Part of the Resource Monitor: :class:`ResourceMonitor <coordinator.monitor.resources.ResourceMonitor>`
feeds every telemetry batch's newest sample in, and the QoS Manager reads
:meth:`TaskQosStore.get` (through ``ResourceMonitor.task_qos``) to compare a task with its
targets. Telemetry is untrusted input: a NaN, infinite or negative value is dropped (the
field reads as unknown), task ids and reasons are bounded, and so is the number of tasks
kept (the least recently updated go first).

A reading with ``metrics_unavailable`` set says the agent could not read the endpoint; it
carries no values and must never count as a QoS violation.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from common.pb.gptrm.v1 import types_pb2

__all__ = ["MAX_TASKS", "VALUE_FIELDS", "TaskQos", "TaskQosStore", "task_qos_from_proto"]

MAX_TASKS = 4096
"""Tasks whose latest reading is kept."""
VALUE_FIELDS = ("latency_p95_s", "ttft_p95_s", "tokens_per_s", "requests_running", "requests_waiting")
_MAX_PER_SAMPLE = 256        # a node runs a handful of tasks; a sample claiming more is cut
_MAX_TASK_ID = 256
_MAX_REASON = 256
_MAX_WINDOW_S = 86_400.0


@dataclass(frozen=True, slots=True)
class TaskQos:
    """One task's latest reading; a value is None when unknown.

    :param task_id: the task.
    :param node_id: the node whose agent scraped it.
    :param received_unix_s: when the coordinator received it (its own clock).
    :param scraped_unix_s: when the agent's scrape ended (the agent's clock).
    :param latency_p95_s: end-to-end request latency p95 over ``window_s``.
    :param ttft_p95_s: time-to-first-token p95 over ``window_s``.
    :param tokens_per_s: generated tokens per second over ``window_s``.
    :param requests_running: requests being served.
    :param requests_waiting: requests queued.
    :param window_s: the time the percentiles and the rate cover.
    :param metrics_unavailable: why the endpoint could not be read; "" when it was.
    """

    task_id: str
    node_id: str
    received_unix_s: float
    scraped_unix_s: float = 0.0
    latency_p95_s: float | None = None
    ttft_p95_s: float | None = None
    tokens_per_s: float | None = None
    requests_running: float | None = None
    requests_waiting: float | None = None
    window_s: float = 0.0
    metrics_unavailable: str = ""

    @property
    def available(self) -> bool:
        """True when the endpoint was read (the values mean something)."""
        return not self.metrics_unavailable

    def to_proto(self) -> types_pb2.TaskQos:
        """The wire form (Admin ``Task.qos_reading``)."""
        msg = types_pb2.TaskQos(task_id=self.task_id, window_s=self.window_s,
                                metrics_unavailable=self.metrics_unavailable, scraped_unix_s=self.scraped_unix_s)
        for name in VALUE_FIELDS:
            value = getattr(self, name)
            if value is not None:
                setattr(msg, name, value)
        return msg


def _value(msg: types_pb2.TaskQos, name: str) -> float | None:
    """A present, finite, non-negative value, else None."""
    if not msg.HasField(name):
        return None
    value = getattr(msg, name)
    return value if math.isfinite(value) and value >= 0 else None


def _valid_id(task_id: str) -> bool:
    return 0 < len(task_id) <= _MAX_TASK_ID and task_id.isprintable() and not any(c.isspace() for c in task_id)


def task_qos_from_proto(msg: types_pb2.TaskQos, node_id: str, received_unix_s: float) -> TaskQos | None:
    """A validated reading, or None when the task id is unusable.

    :param msg: one ``TelemetrySample.task_qos`` entry.
    :param node_id: the node that sent it.
    :param received_unix_s: the coordinator's time of receipt.
    """
    if not _valid_id(msg.task_id):
        return None
    window = msg.window_s if math.isfinite(msg.window_s) and 0 <= msg.window_s <= _MAX_WINDOW_S else 0.0
    scraped = msg.scraped_unix_s if math.isfinite(msg.scraped_unix_s) and msg.scraped_unix_s >= 0 else 0.0
    unavailable = msg.metrics_unavailable[:_MAX_REASON]
    values = {} if unavailable else {name: _value(msg, name) for name in VALUE_FIELDS}
    return TaskQos(msg.task_id, node_id, received_unix_s, scraped, window_s=window,
                   metrics_unavailable=unavailable, **values)


class TaskQosStore:
    """The latest :class:`TaskQos` per task, at most ``max_tasks`` of them.

    :param max_tasks: the bound; updating a task makes it the most recent, and the least
        recently updated one is dropped beyond the bound.
    :param now: wall clock (unix seconds) stamped on each reading as it arrives.

    Example::

        store = TaskQosStore()
        store.update("n1", sample)
        reading = store.get("task-7")
    """

    def __init__(self, max_tasks: int = MAX_TASKS, now: Callable[[], float] = time.time) -> None:
        self._max = max(1, max_tasks)
        self._now = now
        self._latest: dict[str, TaskQos] = {}

    def __len__(self) -> int:
        return len(self._latest)

    def update(self, node_id: str, sample: types_pb2.TelemetrySample) -> int:
        """Keep the readings of one telemetry sample; returns how many were kept."""
        received = self._now()
        kept = 0
        for msg in sample.task_qos[:_MAX_PER_SAMPLE]:
            reading = task_qos_from_proto(msg, node_id, received)
            if reading is None:
                continue
            self._latest.pop(reading.task_id, None)   # re-inserted last: dicts keep insertion order
            self._latest[reading.task_id] = reading
            kept += 1
        while len(self._latest) > self._max:
            del self._latest[next(iter(self._latest))]
        return kept

    def get(self, task_id: str) -> TaskQos | None:
        """The task's latest reading, or None when none arrived (or it was dropped)."""
        return self._latest.get(task_id)

    def forget(self, task_id: str) -> None:
        """Drop a task's reading (it ended)."""
        self._latest.pop(task_id, None)

    def readings(self) -> list[TaskQos]:
        """Every reading kept, least recently updated first."""
        return list(self._latest.values())
