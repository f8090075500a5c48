"""The task table's read-only accessors that the servicers use."""

from __future__ import annotations

import pytest

from common.errors import NotFound
from common.pb.gptrm.v1 import types_pb2
from coordinator.tasks import TaskTable


def _table() -> TaskTable:
    # reads touch only the in-memory records, none of the collaborators
    table = TaskTable(*[None] * 9)
    table.tasks = {"a": types_pb2.Task(id="a"), "b": types_pb2.Task(id="b")}
    return table


def test_find_returns_the_record_or_none() -> None:
    table = _table()
    assert table.find("a") is table.tasks["a"]
    assert table.find("zz") is None
    with pytest.raises(NotFound):
        table.get("zz")


def test_values_is_a_list_taken_now() -> None:
    table = _table()
    values = table.values()
    assert [t.id for t in values] == ["a", "b"]
    del table.tasks["a"]
    assert [t.id for t in values] == ["a", "b"]
    assert [t.id for t in table.values()] == ["b"]
