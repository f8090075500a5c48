"""The leader's elastic allocator: what it learns from telemetry and task metrics, and how a resize is carried out.

The task table here is an in-memory stand-in (the real one needs etcd; the end-to-end path is
tests/integration/test_elastic.py); telemetry goes through the real ResourceMonitor.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge

from common.pb.gptrm.v1 import types_pb2
from common.types import TERMINAL_STATES, TaskState
from coordinator.config import CoordinatorConfig
from coordinator.elastic.allocator import WARMUP_S, ElasticAllocator
from coordinator.elastic.rules import ElasticSettings, Resize
from coordinator.events import EventBus
from coordinator.monitor.resources import ResourceMonitor
from coordinator.scheduler.pipeline import wish

NOW = 10_000.0


class _Tasks:
    """The task table's reads and its fenced transition, in memory."""

    def __init__(self, *tasks: types_pb2.Task) -> None:
        self.by_id = {t.id: t for t in tasks}
        self.transitions: list[tuple[str, TaskState, str, dict[str, Any]]] = []

    def values(self) -> list[types_pb2.Task]:
        return list(self.by_id.values())

    def live(self) -> list[types_pb2.Task]:
        return [t for t in self.by_id.values() if t.state not in TERMINAL_STATES]

    def live_elastic(self) -> list[types_pb2.Task]:
        return [t for t in self.live() if t.spec.HasField("elastic")]

    def find(self, task_id: str) -> types_pb2.Task | None:
        return self.by_id.get(task_id)

    async def transition(self, task_id: str, state: TaskState, reason: str = "", **updates: Any) -> types_pb2.Task:
        self.transitions.append((task_id, state, reason, updates))
        stored = types_pb2.Task()
        stored.CopyFrom(self.by_id[task_id])
        stored.state = state
        if "elastic" in updates:
            stored.elastic.CopyFrom(updates["elastic"])
        self.by_id[task_id] = stored
        return stored


class _Dispatcher:
    def __init__(self) -> None:
        self.stops: list[tuple[str, str, str]] = []

    def stop(self, task: types_pb2.Task, reason: str, *, checkpoint_signal: str = "") -> bool:
        self.stops.append((task.id, reason, checkpoint_signal))
        return True


def _metrics() -> SimpleNamespace:
    r = CollectorRegistry()
    return SimpleNamespace(registry=r, resizes=Counter("r", "r", ["direction"], registry=r),
                           elastic_gpus=Gauge("g", "g", ["part"], registry=r),
                           elastic_tasks=Gauge("t", "t", registry=r))


def _task(task_id: str = "t-1", *, started: float = NOW - 100, gpus: tuple[int, ...] = (0, 1),
          counter: str = "") -> types_pb2.Task:
    t = types_pb2.Task(id=task_id, state=types_pb2.TASK_STATE_RUNNING, submit_unix_s=NOW - 200)
    t.spec.kind = types_pb2.TASK_KIND_TRAINING
    t.spec.elastic.min_gpus, t.spec.elastic.max_gpus = 1, 4
    if counter:
        t.spec.elastic.throughput_counter = counter
        t.spec.metrics_port = 9000
    t.allocation.nodes.add(node_id="n1", gpu_indices=list(gpus))
    t.history.add(state=types_pb2.TASK_STATE_RUNNING, time_unix_s=started)
    return t


def _sample(util: float, tokens_per_s: float | None = None, task_id: str = "t-1") -> types_pb2.TelemetrySample:
    s = types_pb2.TelemetrySample(time_unix_s=NOW)
    for i in range(4):
        s.gpus.add(index=i, uuid=f"GPU-{i}", util_gpu=util, mem_used_bytes=1, mem_total_bytes=2, power_w=100.0,
                   healthy=True)
    s.host.mem_total_bytes, s.host.mem_used_bytes = 2, 1
    if tokens_per_s is not None:
        s.task_qos.add(task_id=task_id, tokens_per_s=tokens_per_s, window_s=10.0, scraped_unix_s=NOW)
    return s


def _allocator(*tasks: types_pb2.Task) -> tuple[ElasticAllocator, _Tasks, ResourceMonitor, _Dispatcher,
                                                SimpleNamespace, EventBus]:
    table, monitor, dispatcher, metrics, events = _Tasks(*tasks), ResourceMonitor(60, 1, now=lambda: NOW), \
        _Dispatcher(), _metrics(), EventBus(now=lambda: NOW)
    alloc = ElasticAllocator(table, dispatcher, monitor, events, metrics, ElasticSettings(),  # type: ignore[arg-type]
                             now=lambda: NOW)
    return alloc, table, monitor, dispatcher, metrics, events


class TestLearning:
    def test_gpu_utilization_times_gpus_without_a_counter(self) -> None:
        alloc, _table, monitor, *_ = _allocator(_task())
        monitor.ingest("n1", 4, [_sample(0.9)])
        alloc.observe()
        [job] = alloc.jobs()
        assert job.size == 2 and job.curve.points == ((2, pytest.approx(1.8)),)

    def test_the_tasks_own_counter(self) -> None:
        alloc, _table, monitor, *_ = _allocator(_task(counter="samples_total"))
        monitor.ingest("n1", 4, [_sample(0.9, tokens_per_s=512.0)])
        alloc.observe()
        assert alloc.jobs()[0].curve.points == ((2, 512.0),)

    def test_no_reading_in_the_warm_up_after_a_start(self) -> None:
        alloc, _table, monitor, *_ = _allocator(_task(started=NOW - WARMUP_S / 2))
        monitor.ingest("n1", 4, [_sample(0.9)])
        alloc.observe()
        assert alloc.jobs()[0].curve.points == ()

    def test_gauges(self) -> None:
        alloc, _table, _monitor, _d, metrics, _e = _allocator(_task(gpus=(0, 1, 2)))
        alloc.observe()
        assert metrics.elastic_tasks._value.get() == 1
        assert metrics.elastic_gpus.labels("minimum")._value.get() == 1
        assert metrics.elastic_gpus.labels("extra")._value.get() == 2


class TestResize:
    def test_a_resize_is_a_checkpoint_stop_with_its_record(self) -> None:
        task = _task()
        alloc, table, monitor, dispatcher, metrics, events = _allocator(task)
        monitor.ingest("n1", 4, [_sample(0.9)])
        alloc.observe()
        done = asyncio.run(alloc.resize([Resize("t-1", 2, 4, "idle GPUs: expected speed-up ×1.74", 1.74)]))
        assert done == ["t-1"]
        [(task_id, state, _reason, updates)] = table.transitions
        assert (task_id, state) == ("t-1", TaskState.PREEMPTED) and "preemptions" not in updates
        e = updates["elastic"]
        assert (e.gpus, e.target_gpus, e.resizes, e.last_resize_unix_s, e.resize_stop_unix_s) == (2, 4, 1, NOW, NOW)
        assert [(p.gpus, round(p.throughput, 3)) for p in e.curve] == [(2, 1.8)]
        assert [(h.from_gpus, h.to_gpus) for h in e.history] == [(2, 4)]
        assert dispatcher.stops == [("t-1", dispatcher.stops[0][1], "SIGUSR1")]
        assert metrics.resizes.labels("grow")._value.get() == 1
        assert [ev.kind for ev in events._backlog] == ["resize"]
        rng = alloc.range(task)
        assert rng is not None   # the next placement aims at the target
        assert wish(rng, table.by_id["t-1"].elastic.target_gpus) == 4

    def test_a_task_that_moved_on_is_skipped(self) -> None:
        task = _task()
        task.state = types_pb2.TASK_STATE_SUCCEEDED
        alloc, table, _m, dispatcher, _n, _e = _allocator(task)
        assert asyncio.run(alloc.resize([Resize("t-1", 2, 4, "x", 1.5)])) == []
        assert not table.transitions and not dispatcher.stops

    def test_restart_cost_measured_from_the_stop_to_running_again(self) -> None:
        task = _task(started=NOW - 50)
        task.elastic.resize_stop_unix_s = NOW - 62
        alloc, *_ = _allocator(task)
        assert alloc.restart_cost_s(task) == pytest.approx(12.0)
        task.elastic.restart_cost_s = 20.0
        assert alloc.restart_cost_s(task) == pytest.approx(16.0)   # a moving average with the stored one
        fresh = _task("t-2")
        assert alloc.restart_cost_s(fresh) == ElasticSettings().restart_cost_s


class TestVisibility:
    def test_the_leaders_interval_is_a_minute_by_default(self) -> None:
        """Grows and shrinks come at most once a minute unless the operator says otherwise (not five)."""
        assert CoordinatorConfig().elastic_interval_s == ElasticSettings().interval_s == 60.0

    def test_what_blocks_a_grow_is_what_the_cycle_last_noted(self) -> None:
        alloc, *_ = _allocator(_task())
        alloc.note_blocked({"t-1": "queue team: 4 would exceed its limit 3", "t-2": ""})
        assert alloc.grow_blocked("t-1") == "queue team: 4 would exceed its limit 3"
        assert alloc.grow_blocked("t-2") == "" and alloc.grow_blocked("t-3") == ""
        alloc.note_blocked({})
        assert alloc.grow_blocked("t-1") == ""


class TestRanges:
    def test_a_finished_tasks_range_is_dropped_at_the_next_observation(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Ranges are kept for the tasks still to come, not for every task ever seen: once a task has ended (and
        while retention still keeps its record), observe() forgets its range, so the walk over them each cycle
        follows the work in flight."""
        import coordinator.elastic.allocator as allocator_module

        computed: list[str] = []
        real = allocator_module.elastic_range
        monkeypatch.setattr(allocator_module, "elastic_range", lambda spec: computed.append(spec.name) or real(spec))
        running = _task()
        running.spec.name = "r"
        alloc, table, *_ = _allocator(running)
        alloc.range(running)
        alloc.observe()
        alloc.range(running)
        assert computed == ["r"]   # still live: kept
        done = types_pb2.Task()
        done.CopyFrom(running)
        done.state = types_pb2.TASK_STATE_SUCCEEDED
        table.by_id[done.id] = done
        alloc.observe()
        alloc.range(done)
        assert computed == ["r", "r"]   # ended: dropped, computed again when asked
