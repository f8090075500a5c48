"""gptrmctl's elastic flags (--gpus MIN:MAX, --nodes MIN:MAX, --throughput-counter) and the elastic part of a task's
document (JSON schema and the detail view)."""

from __future__ import annotations

import pytest

from common.pb.gptrm.v1 import types_pb2
from coordinator.ctl import human, render
from coordinator.ctl.main import build_parser
from coordinator.ctl.spec import spec_from_args
from coordinator.ctl.transport import EXIT_USAGE, CtlError
from tests.helpers.ctl_schema import validate


def _spec(*argv: str) -> types_pb2.TaskSpec:
    return spec_from_args(build_parser().parse_args(["submit", *argv, "--", "train"]))


class TestElasticFlags:
    def test_gpus_range_on_one_node(self) -> None:
        spec = _spec("--kind", "training", "--gpus", "1:4")
        assert (spec.elastic.min_gpus, spec.elastic.max_gpus, spec.demand.gpus, spec.nodes) == (1, 4, 1.0, 0)

    def test_nodes_range_of_whole_nodes(self) -> None:
        spec = _spec("--kind", "training", "--nodes", "2:8", "--gpus", "8", "--throughput-counter", "samples_total",
                     "--metrics-port", "9100")
        assert (spec.elastic.min_nodes, spec.elastic.max_nodes, spec.gpus_per_node) == (2, 8, 8)
        assert spec.elastic.throughput_counter == "samples_total" and spec.nodes == 0

    def test_plain_numbers_stay_fixed(self) -> None:
        spec = _spec("--gpus", "2", "--nodes", "3")
        assert not spec.HasField("elastic") and (spec.demand.gpus, spec.nodes) == (2.0, 3)

    @pytest.mark.parametrize("argv", [("--gpus", "1:x"), ("--gpus", "1.5:4"), ("--nodes", "1:4"),
                                      ("--gpus", "1:4", "--nodes", "1:2"), ("--throughput-counter", "s"),
                                      ("--gpus", "-1:2")])
    def test_bad_ranges_are_usage_errors(self, argv: tuple[str, ...]) -> None:
        with pytest.raises(CtlError) as info:
            _spec(*argv)
        assert info.value.code == EXIT_USAGE


class TestElasticDocument:
    def _task(self) -> types_pb2.Task:
        spec = _spec("--kind", "training", "--gpus", "1:4")
        task = types_pb2.Task(id="t-1", spec=spec, state=types_pb2.TASK_STATE_RUNNING, submit_unix_s=1.0)
        task.allocation.nodes.add(node_id="n1", gpu_indices=[0, 1])
        task.elastic.resizes = 1
        task.elastic.resize_reason = "t-2 is waiting for GPUs: shrinks to 2"
        task.elastic.last_resize_unix_s = 90.0
        task.elastic.target_gpus = 2
        task.elastic.curve.add(gpus=2, throughput=180.0)
        task.elastic.curve.add(gpus=4, throughput=300.0)
        task.elastic.history.add(time_unix_s=90.0, from_gpus=4, to_gpus=2, reason="t-2 waits", expected_speedup=0.6)
        return task

    def test_json_document_matches_its_schema(self) -> None:
        doc = render.task_dict(self._task(), now=lambda: 100.0)
        validate(doc, "task")
        e = doc["elastic"]
        assert (e["min_gpus"], e["max_gpus"], e["gpus"], e["resizes"]) == (1, 4, 2, 1)
        assert [p["gpus"] for p in e["curve"]] == [2, 4] and e["curve"][1]["speedup"] > e["curve"][0]["speedup"]
        fixed = types_pb2.Task(id="t-2", spec=_spec("--gpus", "1"))
        assert render.task_dict(fixed)["elastic"] is None

    def test_detail_view(self) -> None:
        text = human.task_detail(render.task_dict(self._task(), now=lambda: 100.0), now=lambda: 100.0)
        assert "elastic       1:4 GPUs, 2 GPU(s) now" in text
        assert "resizes       1, last 10s ago" in text or "resizes       1, last" in text
        assert "speed-up      2 GPU(s) 180 busy GPUs" in text

    def test_interval_and_what_blocks_a_grow_are_shown(self) -> None:
        """The leader's interval, when the next resize may come, and why the task does not grow (JSON and view)."""
        task = self._task()
        task.elastic.interval_s = 60.0
        task.elastic.grow_blocked = "queue team: 4 would exceed its limit 3"
        doc = render.task_dict(task, now=lambda: 100.0)
        validate(doc, "task")
        e = doc["elastic"]
        assert (e["interval_s"], e["next_resize_unix_s"], e["grow_blocked"]) == (60.0, 150.0, task.elastic.grow_blocked)
        text = human.task_detail(doc, now=lambda: 100.0)
        assert "interval      at most one resize per 60 s, next one possible in 50s" in text
        assert "growing       blocked: queue team: 4 would exceed its limit 3" in text
        task.elastic.grow_blocked = ""
        assert "growing       nothing blocks it" in human.task_detail(render.task_dict(task), now=lambda: 100.0)
