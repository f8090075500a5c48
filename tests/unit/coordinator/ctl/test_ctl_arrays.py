"""gptrmctl's view of arrays and workflows: one row per array, the JSON documents, the detail lines."""

from __future__ import annotations

from typing import Any

from common.pb.gptrm.v1 import types_pb2
from coordinator.ctl import human, render
from tests.helpers.ctl_schema import validate

S = types_pb2


def _element(i: int, state: types_pb2.TaskState) -> types_pb2.Task:
    spec = S.TaskSpec(name="sweep", argv=["train.py"], array=S.ArraySpec(first=0, last=4, max_running=2))
    return S.Task(id=f"a-0123456789ab_{i}", spec=spec, state=state, array_id="a-0123456789ab", array_index=i,
                  submit_unix_s=1.0)


def _docs() -> list[dict[str, Any]]:
    plain = S.Task(id="t-1", spec=S.TaskSpec(name="eval", argv=["eval.py"], begin_unix_s=1_800_000_000.0,
                                              after=[S.Dependency(kind=S.DEPENDENCY_KIND_OK, ids=["a-0123456789ab"])]),
                   state=S.TASK_STATE_PENDING, reason="waiting for a-0123456789ab to succeed", submit_unix_s=2.0)
    states = [S.TASK_STATE_RUNNING, S.TASK_STATE_RUNNING, S.TASK_STATE_PENDING, S.TASK_STATE_PENDING,
              S.TASK_STATE_SUCCEEDED]
    return [render.task_dict(_element(i, s)) for i, s in enumerate(states)] + [render.task_dict(plain)]


class TestArraysInTheTaskList:
    def test_an_array_is_one_row_with_counts_by_state(self) -> None:
        docs = _docs()
        arrays = render.array_summaries(docs)
        assert arrays == [{"array_id": "a-0123456789ab", "name": "sweep", "elements": 5, "max_running": 2,
                           "states": {"running": 2, "pending": 2, "succeeded": 1}}]
        text = human.tasks_table(human.collapse_arrays(docs, arrays))
        rows = text.splitlines()[1:]
        assert len(rows) == 2
        assert rows[0].startswith("a-0123456789ab") and "2 running, 2 pending, 1 succeeded" in rows[0]
        assert "array of 5 %2" in rows[0]
        assert rows[1].startswith("t-1")

    def test_the_json_documents_match_their_schemas(self) -> None:
        docs = _docs()
        validate({"tasks": docs, "arrays": render.array_summaries(docs), "stale": False}, "tasks")
        assert docs[3]["array_id"] == "a-0123456789ab" and docs[3]["array_index"] == 3
        assert docs[-1]["array_id"] is None and docs[-1]["array_index"] is None

    def test_the_detail_shows_the_array_the_dependencies_and_the_start(self) -> None:
        docs = _docs()
        element = human.task_detail(docs[1])
        assert "element 1 of a-0123456789ab (0-4:1, at most 2 running at once)" in element
        plain = human.task_detail(docs[-1])
        assert "after         ok:a-0123456789ab" in plain and "begins        2027-01-15T08:00:00Z" in plain
