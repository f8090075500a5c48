"""Deadlines (slack order, at risk, missed) and SLO violations from the tasks' own metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from common.pb.gptrm.v1 import types_pb2
from common.types import TaskState
from coordinator.ctl.render import task_dict
from coordinator.domain import Request, Resources
from coordinator.events import EventBus
from coordinator.monitor.resources import ResourceMonitor
from coordinator.profiler import Profiler
from coordinator.qos.watch import Pressure, QosWatch
from coordinator.scheduler.queue import slack_key


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def make_task(tid: str, *, state: TaskState = TaskState.PENDING, deadline: float = 0.0, max_latency_ms: float = 0.0,
              min_tokens_per_s: float = 0.0, name: str = "job", started: float | None = None) -> types_pb2.Task:
    t = types_pb2.Task(id=tid, state=int(state), spec=types_pb2.TaskSpec(name=name, qos=types_pb2.QosSpec(
        deadline_unix_s=deadline, max_latency_ms=max_latency_ms, min_tokens_per_s=min_tokens_per_s)))
    if started is not None:
        t.history.append(types_pb2.TaskStateChange(state=int(TaskState.RUNNING), time_unix_s=started))
    return t


class Rig:
    """A watch over a task dict, with a real monitor, profiler, event bus and counter."""

    def __init__(self, *tasks: types_pb2.Task) -> None:
        self.clock = Clock()
        self.tasks = {t.id: t for t in tasks}
        self.monitor = ResourceMonitor(60.0, 1.0, now=self.clock)
        self.profiler = Profiler()
        self.events = EventBus(now=self.clock)
        self.registry = CollectorRegistry()
        counter = Counter("gptrm_qos_violations_total", "v", ["kind"], registry=self.registry)
        self.watch = QosWatch(lambda: self.tasks, self.monitor, self.profiler, self.events, counter, 1.0,
                              now=self.clock)

    def count(self, kind: str) -> float:
        return self.registry.get_sample_value("gptrm_qos_violations_total", {"kind": kind}) or 0.0

    def violations(self) -> list[tuple[str, str]]:
        return [(e.fields["violation"], e.fields["cleared"]) for e in self.events.recent(100)
                if e.kind == "qos_violation"]

    def reading(self, tid: str, **values: float | str) -> None:
        self.monitor.ingest("n1", 0, [types_pb2.TelemetrySample(
            time_unix_s=self.clock.t, task_qos=[types_pb2.TaskQos(task_id=tid, window_s=10.0, **values)])])


class TestSlackOrder:
    def test_least_slack_first_within_a_priority(self) -> None:
        """Within a priority the task with less slack (deadline minus expected run time) goes first; priority
        still comes first and no deadline goes last."""
        def req(tid: str, priority: int = 0, deadline: float | None = None) -> Request:
            return Request(task_id=tid, demand=Resources(gpus=1), priority=priority, submit_s=1.0, deadline_s=deadline)
        reqs = [req("none"), req("late-but-short", deadline=2000.0), req("early-but-long", deadline=1500.0),
                req("high", priority=5)]
        expected = {"late-but-short": 10.0, "early-but-long": 900.0}
        order = [r.task_id for r in sorted(reqs, key=slack_key(1000.0, expected))]
        assert order == ["high", "early-but-long", "late-but-short", "none"]
        expected["early-but-long"] = 100.0
        order = [r.task_id for r in sorted(reqs, key=slack_key(1000.0, expected))]
        assert order == ["high", "early-but-long", "late-but-short", "none"]
        expected["late-but-short"] = 990.0
        order = [r.task_id for r in sorted(reqs, key=slack_key(1000.0, expected))]
        assert order == ["high", "late-but-short", "early-but-long", "none"]


class TestDeadlines:
    def test_at_risk_then_missed_counted_once(self) -> None:
        """A task whose expected run time no longer fits before its deadline is reported once; missing it is a
        second event, not a second count; gptrmctl marks it."""
        rig = Rig(make_task("t1", deadline=1100.0, name="train"))
        rig.watch.check()
        assert rig.violations() == [] and rig.count("deadline") == 0
        rig.profiler.observe_run(types_pb2.TaskSpec(name="train"), 300.0)
        rig.watch.check()
        rig.watch.check()
        assert rig.violations() == [("deadline", "false")] and rig.count("deadline") == 1
        assert not task_dict(rig.tasks["t1"], now=rig.clock)["deadline_missed"]
        rig.clock.t = 1200.0
        rig.watch.check()
        assert len(rig.violations()) == 2 and rig.count("deadline") == 1
        assert rig.watch.violations("t1") == {"deadline": "missed"}
        assert task_dict(rig.tasks["t1"], now=rig.clock)["deadline_missed"]

    def test_running_task_counts_what_it_already_ran(self) -> None:
        """A running task needs only the rest of its expected run time."""
        rig = Rig(make_task("t1", state=TaskState.RUNNING, deadline=1100.0, name="train", started=800.0))
        rig.profiler.observe_run(types_pb2.TaskSpec(name="train"), 300.0)
        rig.watch.check()
        assert rig.count("deadline") == 0


class TestSlo:
    def test_latency_raised_then_cleared(self) -> None:
        """p95 over the bound raises a latency violation (once), back under it clears it."""
        rig = Rig(make_task("s1", state=TaskState.RUNNING, max_latency_ms=500.0))
        rig.reading("s1", latency_p95_s=0.2, requests_running=1.0)
        rig.watch.check()
        assert rig.violations() == [] and rig.watch.pressure("s1") is Pressure.LESS
        rig.reading("s1", latency_p95_s=0.9, requests_running=4.0)
        rig.watch.check()
        rig.watch.check()
        assert rig.violations() == [("latency", "false")] and rig.count("latency") == 1
        assert rig.watch.pressure("s1") is Pressure.MORE
        rig.reading("s1", latency_p95_s=0.3, requests_running=1.0)
        rig.watch.check()
        assert rig.violations() == [("latency", "false"), ("latency", "true")]
        assert rig.watch.pressure("s1") is Pressure.STEADY

    def test_unavailable_or_stale_is_never_a_violation(self) -> None:
        """An unreadable endpoint and an old reading neither raise nor clear, and give no pressure."""
        rig = Rig(make_task("s1", state=TaskState.RUNNING, max_latency_ms=500.0, min_tokens_per_s=100.0))
        rig.reading("s1", metrics_unavailable="connection refused")
        rig.watch.check()
        assert rig.violations() == [] and rig.watch.pressure("s1") is None
        rig.reading("s1", latency_p95_s=2.0, tokens_per_s=5.0, requests_waiting=3.0)
        rig.clock.t += 60.0
        rig.watch.check()
        assert rig.violations() == [] and rig.watch.pressure("s1") is None

    def test_throughput_only_counts_while_busy(self) -> None:
        """Tokens/s under the floor is a violation while requests wait, not while the server is idle."""
        rig = Rig(make_task("s1", state=TaskState.RUNNING, min_tokens_per_s=100.0))
        rig.reading("s1", tokens_per_s=0.0, requests_running=0.0, requests_waiting=0.0)
        rig.watch.check()
        assert rig.violations() == []
        rig.reading("s1", tokens_per_s=20.0, requests_running=2.0, requests_waiting=5.0)
        rig.watch.check()
        assert rig.violations() == [("throughput", "false")] and rig.count("throughput") == 1
