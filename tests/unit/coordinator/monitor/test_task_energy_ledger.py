"""Per-task energy from the agents' running shares (coordinator/monitor/task_energy.py), its metric and its display."""

from __future__ import annotations

import math

from prometheus_client.parser import text_string_to_metric_families

from common.pb.gptrm.v1 import types_pb2
from common.types import TaskKind, TaskState
from coordinator.ctl.human import task_detail
from coordinator.ctl.render import task_dict
from coordinator.monitor.metrics import Metrics
from coordinator.monitor.nodes import NodeRegistry
from coordinator.monitor.resources import ResourceMonitor
from coordinator.monitor.task_energy import TaskEnergy


def sample(t: float, **shares: float) -> types_pb2.TelemetrySample:
    """One telemetry sample whose host lists each task's running energy total."""
    s = types_pb2.TelemetrySample(time_unix_s=t)
    for task_id, joules in shares.items():
        s.host.tasks.add(task_id=task_id, energy_share_j=joules)
    return s


class TestTaskEnergy:
    def test_increases_add_up_over_nodes(self) -> None:
        """A task on two nodes gets the sum of both agents' totals, counted once per increase."""
        e = TaskEnergy()
        e.observe("n1", sample(1, t1=100.0))
        e.observe("n1", sample(2, t1=250.0))
        e.observe("n2", sample(2, t1=40.0))
        assert e.current("t1") == 290.0

    def test_agent_restart_adds_the_new_total(self) -> None:
        """A total that went down (the agent restarted) adds its new value, losing nothing counted before."""
        e = TaskEnergy()
        e.observe("n1", sample(1, t1=500.0))
        e.observe("n1", sample(2, t1=30.0))
        e.observe("n1", sample(3, t1=50.0))
        assert e.current("t1") == 550.0

    def test_bad_values_are_ignored(self) -> None:
        """NaN, infinite, negative shares and oversized ids change nothing."""
        e = TaskEnergy()
        e.observe("n1", sample(1, t1=10.0))
        for bad in (math.nan, math.inf, -5.0):
            e.observe("n1", sample(2, t1=bad))
        e.observe("n1", sample(3, **{"x" * 200: 7.0}))
        assert e.current("t1") == 10.0 and len(e) == 1

    def test_finish_hands_over_once_and_counts_by_kind(self) -> None:
        """finish returns the task's joules, forgets it, and adds them to its kind's total only."""
        e = TaskEnergy()
        e.observe("n1", sample(1, t1=72.0, t2=8.0))
        assert e.finish("t1", TaskKind.TRAINING) == 72.0
        assert e.finish("t1", TaskKind.TRAINING) == 0.0
        assert e.finish("t2", 99) == 8.0   # an unknown kind counts as unspecified
        assert e.by_kind["training"] == 72.0 and e.by_kind["unspecified"] == 8.0 and e.by_kind["inference"] == 0.0
        assert e.current("t1") == 0.0

    def test_number_of_tasks_is_bounded(self) -> None:
        """Beyond the bound the least recently updated task is dropped."""
        e = TaskEnergy(max_tasks=2)
        e.observe("n1", sample(1, a=1.0, b=2.0))
        e.observe("n1", sample(2, c=3.0))
        assert len(e) == 2 and e.current("a") == 0.0 and e.current("c") == 3.0


class TestMonitorAndMetric:
    def test_monitor_feeds_every_sample_and_metric_is_by_kind(self) -> None:
        """Ingested samples reach the store; the ended tasks' joules are exported by kind, without task labels."""
        monitor, registry = ResourceMonitor(history_s=10, interval_s=1), NodeRegistry(1.0, 5.0)
        monitor.ingest("n1", 0, [sample(1, t1=10.0), sample(2, t1=30.0)])
        assert monitor.task_energy.current("t1") == 30.0
        monitor.task_energy.finish("t1", TaskKind.INFERENCE)
        body, _ = Metrics(monitor, registry, dict).exposition()
        fams = {f.name: f for f in text_string_to_metric_families(body.decode())}
        samples = {s.labels["kind"]: s.value for s in fams["gptrm_task_energy_joules"].samples}
        assert samples == {"unspecified": 0.0, "training": 0.0, "fine-tuning": 0.0, "inference": 30.0}


class TestDisplay:
    def test_json_and_human_show_energy(self) -> None:
        """-o json carries joules; the human view shows kWh, 'so far' only while the task runs."""
        task = types_pb2.Task(id="t-1", state=int(TaskState.SUCCEEDED), energy_j=7.2e6,
                              spec=types_pb2.TaskSpec(name="x", argv=["true"]))
        doc = task_dict(task)
        assert doc["energy_j"] == 7.2e6
        assert "energy        2.0000 kWh\n" in task_detail(doc) + "\n"
        doc["state"] = "running"
        assert "energy        2.0000 kWh so far" in task_detail(doc)
