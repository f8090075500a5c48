"""``gptrmctl tasks`` prints a long listing page by page, as the pages arrive."""

from __future__ import annotations

import argparse
import io
import json
from collections.abc import Iterator
from typing import Any

import pytest

from coordinator.ctl import human, render
from coordinator.ctl.main import _collapsed, _counted, _stream_pages


def _doc(i: int) -> dict[str, Any]:
    return {"task_id": f"t-{i}", "name": f"n{i}", "state": "succeeded", "priority": 0, "allocation": [],
            "submit_unix_s": 0.0, "reason": "", "deadline_missed": False}


def _pages(out: io.StringIO, pages: list[list[dict[str, Any]]], seen: list[str]) -> Iterator[tuple[list, bool]]:
    for n, page in enumerate(pages):
        seen.append(out.getvalue())   # what was printed before this page was asked for
        yield page, n == 1


@pytest.mark.parametrize("output", ["json", "table"])
def test_pages_are_printed_as_they_arrive(monkeypatch: pytest.MonkeyPatch, output: str) -> None:
    """Each page is out before the next is fetched; -o json is the one document dump_json writes (stale from
    any page), and the table has its header once and every row."""
    out = io.StringIO()
    monkeypatch.setattr("sys.stdout", out)
    pages = [[_doc(0), _doc(1)], [_doc(2)], [_doc(3), _doc(4)]]
    seen: list[str] = []
    stale = _stream_pages(argparse.Namespace(output=output), "tasks", _pages(out, pages, seen),
                          lambda docs: human.tasks_table(docs, now=lambda: 0.0))
    assert stale is True
    assert "t-0" not in seen[0] and "t-1" in seen[1] and "t-2" in seen[2] and "t-3" not in seen[2]
    if output == "json":
        every = [d for p in pages for d in p]
        assert json.loads(out.getvalue()) == json.loads(render.dump_json({"tasks": every, "stale": True}))
    else:
        lines = out.getvalue().splitlines()
        assert sum(1 for line in lines if line.startswith("TASK")) == 1 and len(lines) == 6


def test_an_empty_listing(monkeypatch: pytest.MonkeyPatch) -> None:
    """No tasks: an empty list in JSON, the header alone in a table."""
    for output, expected in (("json", {"tasks": [], "stale": False}), ("table", None)):
        out = io.StringIO()
        monkeypatch.setattr("sys.stdout", out)
        _stream_pages(argparse.Namespace(output=output), "tasks", iter([([], False)]),
                      lambda docs: human.tasks_table(docs))
        if expected is not None:
            assert json.loads(out.getvalue()) == expected
        else:
            assert out.getvalue().splitlines()[0].startswith("TASK") and len(out.getvalue().splitlines()) == 1


def _element(array_id: str, index: int, state: str) -> dict[str, Any]:
    return {**_doc(index), "task_id": f"{array_id}_{index}", "name": "sweep", "state": state, "array_id": array_id,
            "spec": {"array": {"max_running": 0}}}


@pytest.mark.parametrize("output", ["json", "table"])
def test_an_array_is_one_row_and_the_rows_before_it_stream(monkeypatch: pytest.MonkeyPatch, output: str) -> None:
    """A table streams until a page holds an array element; from there on the rows wait for the last page, so
    the array's one row counts every element, wherever its elements came. -o json streams every task as it is
    and ends with the arrays' summaries, the same document as render.array_summaries gives."""
    a = "a-0123456789ab"
    pages = [[_doc(0), _doc(1)], [_doc(2), _element(a, 0, "running")], [_element(a, 1, "pending"), _doc(3)],
             [_element(a, 2, "pending")]]
    every = [d for p in pages for d in p]
    out = io.StringIO()
    monkeypatch.setattr("sys.stdout", out)
    seen: list[str] = []
    arrays: dict[str, dict[str, Any]] = {}
    counted = _counted(_pages(out, pages, seen), arrays)
    _stream_pages(argparse.Namespace(output=output), "tasks",
                  counted if output == "json" else _collapsed(counted, arrays),
                  lambda docs: human.tasks_table(docs, now=lambda: 0.0),
                  tail=lambda: {"arrays": list(arrays.values())})
    assert "t-1" in seen[1]   # the page before the array's first element was out before the next came
    if output == "json":
        assert f"{a}_0" in seen[2]   # json streams elements too
        assert json.loads(out.getvalue()) == json.loads(render.dump_json(
            {"tasks": every, "arrays": render.array_summaries(every), "stale": True}))
    else:
        text = out.getvalue()
        rows = text.splitlines()
        assert sum(1 for line in rows if line.startswith("TASK")) == 1
        assert [r.split()[0] for r in rows[1:]] == ["t-0", "t-1", "t-2", a, "t-3"]
        assert "2 pending, 1 running" in text and f"{a}_1" not in text
