"""The agent keeps each task's declared metrics endpoint in its durable table and hands it to the scraper."""

from __future__ import annotations

from pathlib import Path

from agent.runtime import TaskRuntime
from agent.tasktable import TaskRecord, TaskTable
from common.types import TaskState


def record(task_id: str, state: TaskState, url: str = "", **kw: object) -> TaskRecord:
    return TaskRecord(task_id, "d", 1, 0.0, [], [], "", "", 10.0, int(state), 0.0, metrics_url=url, **kw)


class TestMetricsTargets:
    def test_running_tasks_with_an_endpoint(self, tmp_path: Path) -> None:
        """Only running, not-stopping tasks that declared an endpoint are scraped, with merged names."""
        rt = TaskRuntime(tmp_path, lambda status: None, gpus=None)
        url = "http://127.0.0.1:8000/metrics"
        rt.table.tasks.update({
            "serve": record("serve", TaskState.RUNNING, url, metrics_flavour="tgi",
                            metrics_names={"waiting_gauge": "my_queue"}),
            "paused": record("paused", TaskState.PAUSED, url),
            "stopping": record("stopping", TaskState.RUNNING, url, stopping=True),
            "train": record("train", TaskState.RUNNING),
        })
        targets = rt.metrics_targets()
        assert list(targets) == ["serve"]
        t = targets["serve"]
        assert t.url == url and t.problem == ""
        assert (t.names.waiting_gauge, t.names.latency_histogram) == ("my_queue", "tgi_request_duration")

    def test_endpoint_survives_an_agent_restart(self, tmp_path: Path) -> None:
        """The endpoint is saved with the task, so an agent that adopts the task after a restart scrapes it."""
        table = TaskTable(tmp_path / "tasks.json")
        table.tasks["serve"] = record("serve", TaskState.RUNNING, "http://localhost:9/m", metrics_flavour="custom",
                                      metrics_names={"tokens_counter": "toks"})
        table.save()
        loaded = TaskTable.load(tmp_path / "tasks.json").tasks["serve"]
        assert (loaded.metrics_url, loaded.metrics_flavour, loaded.metrics_names) == \
            ("http://localhost:9/m", "custom", {"tokens_counter": "toks"})
