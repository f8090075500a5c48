"""Admin API pagination: bounded pages in a stable order, opaque tokens, refused bad tokens."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from common.errors import ValidationError
from common.pb.gptrm.v1 import types_pb2
from coordinator.api.pages import MAX_PAGE_SIZE, _encode, page_in_order, paginate


def _tasks(n: int, name_bytes: int = 0) -> list[types_pb2.Task]:
    return [types_pb2.Task(id=f"t-{i:03d}", submit_unix_s=float(i % 7), spec=types_pb2.TaskSpec(name="x" * name_bytes))
            for i in range(n)]


def _key(t: types_pb2.Task) -> tuple:
    return (t.submit_unix_s, t.id)


def _walk(items: list[types_pb2.Task], size: int, **kw: int) -> list[list[str]]:
    pages, token = [], ""
    while True:
        page, token = paginate(items, _key, size, token, **kw)
        pages.append([t.id for t in page])
        if not token:
            return pages


class TestPaginate:
    def test_pages_cover_every_item_once_in_order(self) -> None:
        """Walking pages of 4 over 23 items returns each once, sorted by (submit time, id), the last page short."""
        items = _tasks(23)
        pages = _walk(items, 4)
        assert [len(p) for p in pages] == [4, 4, 4, 4, 4, 3]
        assert [i for p in pages for i in p] == [t.id for t in sorted(items, key=_key)]

    def test_items_added_between_pages_are_not_repeated(self) -> None:
        """An item removed or added between two calls never makes the walk repeat an item."""
        items = _tasks(10)
        first, token = paginate(items, _key, 5, "")
        rest, _ = paginate(items[3:] + _tasks(12)[10:], _key, 100, token)
        assert not {t.id for t in first} & {t.id for t in rest}

    def test_pages_are_bounded_in_bytes(self) -> None:
        """Large items make smaller pages: every page stays under the byte bound, with at least one item."""
        items = _tasks(10, name_bytes=1000)
        pages = _walk(items, 100, max_bytes=3500)
        assert all(1 <= len(p) <= 3 for p in pages) and len([i for p in pages for i in p]) == 10
        assert _walk(_tasks(2, name_bytes=5000), 100, max_bytes=100) == [["t-000"], ["t-001"]]

    @pytest.mark.parametrize("token", ["not-base64!!", "aGVsbG8=", "W3siYSI6IDF9XQ==", "x" * 5000])
    def test_bad_token_refused(self, token: str) -> None:
        """A token the server did not issue is refused naming page_token."""
        with pytest.raises(ValidationError) as e:
            paginate(_tasks(3), _key, 2, token)
        assert e.value.field == "page_token"

    def test_page_size_bounded(self) -> None:
        """A page size above the maximum is refused naming page_size."""
        with pytest.raises(ValidationError) as e:
            paginate(_tasks(3), _key, MAX_PAGE_SIZE + 1, "")
        assert e.value.field == "page_size"


class TestPageInOrder:
    def test_same_pages_as_paginate_reading_only_the_page(self) -> None:
        """Over items kept in key order, the walk gives paginate's pages and tokens, and reads one item past
        the page at most."""
        items = sorted(_tasks(23), key=_key)
        read: list[int] = []

        def walk(after: tuple | None) -> Iterator[types_pb2.Task]:
            for i, t in enumerate(items):
                if after is None or _key(t) > after:
                    read.append(i)
                    yield t

        token, expected = "", ""
        while True:
            read.clear()
            page, token = page_in_order(walk, _key, 4, token)
            want, expected = paginate(items, _key, 4, expected)
            assert page == want and token == expected
            assert len(read) <= 5
            if not token:
                break

    def test_a_foreign_token_is_refused(self) -> None:
        """A token whose key does not compare with the list's keys is refused naming page_token."""
        items = sorted(_tasks(3), key=_key)
        token = _encode(("x",))
        with pytest.raises(ValidationError, match="page_token"):
            page_in_order(lambda after: (t for t in items if after is None or _key(t) > after), _key, 2, token)
