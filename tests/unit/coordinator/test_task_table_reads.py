"""The task table's read-only accessors that the servicers use."""

from __future__ import annotations

import pytest

from common.errors import NotFound
from common.pb.gptrm.v1 import types_pb2
from coordinator.tasks import TaskTable


def _table() -> TaskTable:
    # reads touch only the in-memory records, none of the collaborators
    table = TaskTable(*[None] * 9)
    table.replace_all({"a": types_pb2.Task(id="a"), "b": types_pb2.Task(id="b")})
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
    table.replace_all({"b": table.tasks["b"]})
    assert [t.id for t in values] == ["a", "b"]
    assert [t.id for t in table.values()] == ["b"]


def test_the_table_is_read_only_from_outside() -> None:
    """Readers get a live view they cannot change; changes go through the table's methods."""
    table = _table()
    view = table.view()
    with pytest.raises(TypeError):
        view["c"] = types_pb2.Task(id="c")  # type: ignore[index]
    table.accept(types_pb2.Task(id="c"))
    assert "c" in view and table.find("c") is view["c"]
