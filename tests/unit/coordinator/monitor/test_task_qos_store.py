"""Task QoS readings at the coordinator: validated, bounded, readable per task, exported as gauges."""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from common.pb.gptrm.v1 import types_pb2
from coordinator.monitor.metrics import MAX_TASK_SERIES, Metrics, _TaskQosCollector
from coordinator.monitor.nodes import NodeRegistry
from coordinator.monitor.resources import ResourceMonitor
from coordinator.monitor.task_qos import TaskQos, TaskQosStore, task_qos_from_proto


def sample(*readings: types_pb2.TaskQos, t: float = 1.0) -> types_pb2.TelemetrySample:
    return types_pb2.TelemetrySample(time_unix_s=t, task_qos=list(readings))


def reading(task_id: str = "t1", **values: float) -> types_pb2.TaskQos:
    return types_pb2.TaskQos(task_id=task_id, window_s=30.0, scraped_unix_s=99.0, **values)


class TestTaskQosFromProto:
    """Telemetry is untrusted: bad values are dropped, not stored."""

    def test_valid_values_kept(self) -> None:
        """Every finite, non-negative value is kept with the node and the receipt time."""
        r = task_qos_from_proto(reading(latency_p95_s=0.4, ttft_p95_s=0.05, tokens_per_s=900.0,
                                        requests_running=3.0, requests_waiting=0.0), "n1", 100.0)
        assert r == TaskQos("t1", "n1", 100.0, 99.0, 0.4, 0.05, 900.0, 3.0, 0.0, 30.0, "")
        assert r.available

    def test_nan_inf_and_negative_values_dropped(self) -> None:
        """NaN, infinite and negative values read as unknown (None); absent ones stay unknown."""
        r = task_qos_from_proto(reading(latency_p95_s=math.nan, ttft_p95_s=math.inf, tokens_per_s=-5.0,
                                        requests_running=2.0), "n1", 0.0)
        assert r is not None
        assert (r.latency_p95_s, r.ttft_p95_s, r.tokens_per_s, r.requests_running, r.requests_waiting) == \
            (None, None, None, 2.0, None)

    def test_unavailable_carries_no_values(self) -> None:
        """A reading that says the endpoint was unreadable keeps its reason and no values."""
        msg = reading(latency_p95_s=9.0)
        msg.metrics_unavailable = "connection refused" + "x" * 1000
        r = task_qos_from_proto(msg, "n1", 0.0)
        assert r is not None and not r.available and r.latency_p95_s is None
        assert r.metrics_unavailable.startswith("connection refused") and len(r.metrics_unavailable) == 256

    def test_bad_window_and_task_ids(self) -> None:
        """An absurd window reads as 0; an empty, spaced or overlong task id drops the reading."""
        msg = reading()
        msg.window_s = math.nan
        assert task_qos_from_proto(msg, "n1", 0.0).window_s == 0.0   # type: ignore[union-attr]
        for bad in ("", "a b", "x" * 300, "t\n1"):
            assert task_qos_from_proto(reading(bad), "n1", 0.0) is None


class TestTaskQosStore:
    """The latest reading per task, least recently updated dropped beyond the bound."""

    def test_latest_wins_and_bound_holds(self) -> None:
        """A newer reading replaces the older; beyond max_tasks the least recently updated task goes."""
        store = TaskQosStore(max_tasks=2, now=lambda: 5.0)
        store.update("n1", sample(reading("a", latency_p95_s=1.0), reading("b")))
        store.update("n1", sample(reading("a", latency_p95_s=2.0)))
        store.update("n2", sample(reading("c")))
        assert len(store) == 2 and store.get("b") is None
        a = store.get("a")
        assert a is not None and a.latency_p95_s == 2.0 and a.received_unix_s == 5.0
        store.forget("a")
        assert [r.task_id for r in store.readings()] == ["c"]


class TestMonitorAccessor:
    """ResourceMonitor.task_qos serves the newest sample's readings of every batch."""

    def test_ingest_then_read(self) -> None:
        """After a batch, task_qos(task_id) returns the reading of the batch's newest sample."""
        monitor = ResourceMonitor(history_s=10, interval_s=1, now=lambda: 50.0)
        monitor.ingest("n1", 0, [sample(reading(latency_p95_s=0.3), t=1.0), sample(reading(latency_p95_s=0.6), t=2.0)])
        r = monitor.task_qos("t1")
        assert r is not None and (r.node_id, r.latency_p95_s, r.received_unix_s) == ("n1", 0.6, 50.0)
        assert monitor.task_qos("other") is None
        monitor.forget_task_qos("t1")
        assert monitor.task_qos("t1") is None


def families(monitor: ResourceMonitor, now: float) -> dict[str, list]:
    registry = CollectorRegistry()
    registry.register(_TaskQosCollector(monitor, now=lambda: now))
    return {f.name: f.samples for f in text_string_to_metric_families(generate_latest(registry).decode())}


class TestTaskQosGauges:
    """Per-task gauges, labelled by task only, fresh readings only, bounded in number."""

    def test_gauges(self) -> None:
        """Known values become gauges; unknown ones are left out; availability is 1 or 0."""
        monitor = ResourceMonitor(history_s=10, interval_s=1, now=lambda: 100.0)
        down = reading("down")
        down.metrics_unavailable = "connection refused"
        monitor.ingest("n1", 0, [sample(reading("up", latency_p95_s=0.25, tokens_per_s=640.0), down)])
        fams = families(monitor, now=110.0)
        assert [(s.labels, s.value) for s in fams["gptrm_task_latency_p95_seconds"]] == [({"task": "up"}, 0.25)]
        assert [(s.labels, s.value) for s in fams["gptrm_task_tokens_per_second"]] == [({"task": "up"}, 640.0)]
        assert fams["gptrm_task_ttft_p95_seconds"] == []
        assert {s.labels["task"]: s.value for s in fams["gptrm_task_metrics_available"]} == {"up": 1.0, "down": 0.0}

    def test_stale_readings_left_out(self) -> None:
        """A reading a minute old (the task ended or its agent went quiet) is not exported."""
        monitor = ResourceMonitor(history_s=10, interval_s=1, now=lambda: 100.0)
        monitor.ingest("n1", 0, [sample(reading("old", latency_p95_s=1.0))])
        assert families(monitor, now=161.0)["gptrm_task_latency_p95_seconds"] == []

    def test_series_bounded(self) -> None:
        """However many tasks report, at most MAX_TASK_SERIES series per gauge, the most recent ones."""
        monitor = ResourceMonitor(history_s=10, interval_s=1, now=lambda: 100.0)
        n = MAX_TASK_SERIES + 50
        for i in range(0, n, 200):
            monitor.ingest("n1", 0, [sample(*(reading(f"t{j}", latency_p95_s=1.0) for j in range(i, min(n, i + 200))))])
        series = families(monitor, now=100.0)["gptrm_task_latency_p95_seconds"]
        assert len(series) == MAX_TASK_SERIES and series[-1].labels["task"] == f"t{n - 1}"

    def test_registered_on_the_coordinator_registry(self) -> None:
        """The coordinator's exposition carries the task gauges."""
        monitor = ResourceMonitor(history_s=10, interval_s=1)
        monitor.ingest("n1", 0, [sample(reading("serve", latency_p95_s=0.5))])
        body, _ = Metrics(monitor, NodeRegistry(1.0, 5.0), dict).exposition()
        assert 'gptrm_task_latency_p95_seconds{task="serve"} 0.5' in body.decode()
