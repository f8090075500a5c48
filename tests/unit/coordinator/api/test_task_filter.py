"""Which tasks a ``TaskFilter`` names (``tasks --user/--queue/--name/--state``, bulk cancel)."""

from __future__ import annotations

import pytest

from common.errors import ValidationError
from common.pb.gptrm.v1 import admin_pb2, types_pb2
from coordinator.api.task_filter import filter_given, task_matcher


def _task(name: str = "train-1", user: str = "alice", queue: str = "a",
          state: types_pb2.TaskState = types_pb2.TASK_STATE_RUNNING) -> types_pb2.Task:
    return types_pb2.Task(id="t-1", spec=types_pb2.TaskSpec(name=name), submitted_by=user, queue=queue, state=state)


class TestTaskMatcher:
    def test_every_given_field_must_match(self) -> None:
        keep = task_matcher(admin_pb2.TaskFilter(users=["alice"], queues=["a"], name="train-*",
                                                 states=[types_pb2.TASK_STATE_RUNNING]))
        assert keep(_task())
        assert not keep(_task(user="bob"))
        assert not keep(_task(queue="b"))
        assert not keep(_task(name="eval-1"))
        assert not keep(_task(state=types_pb2.TASK_STATE_PENDING))

    def test_default_names_the_default_queue(self) -> None:
        """``--queue default`` names tasks stored with no queue, as ``tasks`` shows them."""
        assert task_matcher(admin_pb2.TaskFilter(queues=["default"]))(_task(queue=""))

    def test_an_empty_filter_names_everything_but_is_not_given(self) -> None:
        assert task_matcher(admin_pb2.TaskFilter())(_task())
        assert not filter_given(admin_pb2.TaskFilter())

    @pytest.mark.parametrize(("f", "field"), [
        (admin_pb2.TaskFilter(users=["alice", " "]), "filter.users[1]"),
        (admin_pb2.TaskFilter(queues=["x" * 300]), "filter.queues[0]"),
        (admin_pb2.TaskFilter(states=[99]),  # type: ignore[list-item]
     "filter.states[0]"),
        (admin_pb2.TaskFilter(name="*" * 300), "filter.name"),
    ])
    def test_bad_input_names_the_field(self, f: admin_pb2.TaskFilter, field: str) -> None:
        with pytest.raises(ValidationError) as e:
            task_matcher(f)
        assert str(e.value).startswith(field), str(e.value)
