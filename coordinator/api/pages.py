"""Pagination of the Admin API's lists: bounded pages, opaque tokens, stable order.

A page holds at most ``page_size`` items (default :data:`DEFAULT_PAGE_SIZE`, at most
:data:`MAX_PAGE_SIZE`) and at most :data:`MAX_PAGE_BYTES` of serialized items (always at
least one), so a response stays under gRPC's default 4 MiB message limit whatever the
items hold. The token is the sort key of the last item returned, so pages stay consistent
when items are added or removed between calls: nothing is returned twice, and an item
present for the whole walk is returned once.

Example::

    items, token = paginate(tasks, lambda t: (t.submit_unix_s, t.id), request.page_size, request.page_token)
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

from google.protobuf.message import Message

from common.errors import ValidationError

__all__ = ["DEFAULT_PAGE_SIZE", "MAX_PAGE_BYTES", "MAX_PAGE_SIZE", "page_in_order", "paginate"]

DEFAULT_PAGE_SIZE = 500
MAX_PAGE_SIZE = 1000
MAX_PAGE_BYTES = 2 * 1024 * 1024
_MAX_TOKEN = 2048

M = TypeVar("M", bound=Message)


def _encode(key: tuple) -> str:
    return base64.urlsafe_b64encode(json.dumps(list(key)).encode()).decode()


def _decode(token: str) -> tuple:
    if len(token) > _MAX_TOKEN:
        raise ValidationError("page_token", "is too long")
    try:
        key = json.loads(base64.urlsafe_b64decode(token.encode()))
    except (ValueError, UnicodeError):
        raise ValidationError("page_token", "is not a token this server issued") from None
    if not isinstance(key, list) or not all(isinstance(k, str | int | float) for k in key):
        raise ValidationError("page_token", "is not a token this server issued")
    return tuple(key)


def paginate(items: Sequence[M], key: Callable[[M], tuple], page_size: int, page_token: str,
             *, max_bytes: int = MAX_PAGE_BYTES) -> tuple[list[M], str]:
    """One page of ``items`` in ``key`` order after ``page_token``; returns (page, next token or "").

    :raises ValidationError: ``page_size`` above the limit or a token this server did not issue.
    """
    def walk(after: tuple | None) -> Iterable[M]:
        ordered = sorted(items, key=key)
        return ordered if after is None else (m for m in ordered if key(m) > after)

    return page_in_order(walk, key, page_size, page_token, max_bytes=max_bytes)


def page_in_order(walk: Callable[[tuple | None], Iterable[M]], key: Callable[[M], tuple], page_size: int,
                  page_token: str, *, max_bytes: int = MAX_PAGE_BYTES) -> tuple[list[M], str]:
    """One page of items a caller already keeps in ``key`` order: ``walk(after)`` yields them from the first
    one whose key is above ``after`` (None: from the start), and only as many are taken as the page holds, so
    a page costs its own size, not the list's. Same pages and tokens as :func:`paginate`.

    :raises ValidationError: ``page_size`` above the limit or a token this server did not issue.
    """
    if page_size > MAX_PAGE_SIZE:
        raise ValidationError("page_size", f"{page_size} is more than {MAX_PAGE_SIZE}")
    size = page_size or DEFAULT_PAGE_SIZE
    after = _decode(page_token) if page_token else None
    page: list[M] = []
    used = 0
    try:
        for m in walk(after):
            n = m.ByteSize()
            if page and (len(page) >= size or used + n > max_bytes):
                return page, _encode(key(page[-1]))
            page.append(m)
            used += n
    except TypeError:
        raise ValidationError("page_token", "is not a token for this list") from None
    return page, ""
