"""Live pages without polling: one server-sent-events stream per open page, carrying only what changed.

A page is rendered whole on the server; its script then opens the page's stream (``/live/...``, named by
the page's ``data-live``). The stream compares the page's rows (the models of :mod:`coordinator.web.render`)
tick after tick and sends a ``delta`` event with the rows that changed or went away; the Events page and a
task's log are pushed as they happen. The first comparison is against exactly what the page was rendered
with (:class:`Baselines`, named by the ``v`` in the stream's URL), so nothing that changes between the
render and the stream's start is lost, and nothing is sent twice.

The models are computed once per tick for every browser that watches the same thing
(:class:`~coordinator.web.reader.Shared`): the coordinator's work per added browser is a comparison and
a write, not another walk of the fleet. A tick's length grows with what the model costs to compute
(:func:`next_tick`), so a large fleet is refreshed less often rather than using the coordinator's CPU.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

__all__ = ["Baselines", "diff", "next_tick", "sse_event", "ticking"]

Rows = dict[str, Any]


def diff(before: Rows, after: Rows) -> dict[str, Any] | None:
    """What changed from ``before`` to ``after`` (each: key → row): ``{"upsert": {key: row}, "remove": [key]}``,
    or None when nothing did."""
    upsert = {k: v for k, v in after.items() if before.get(k) != v}
    remove = [k for k in before if k not in after]
    if not upsert and not remove:
        return None
    return {"upsert": upsert, "remove": remove}


def next_tick(base_s: float, compute_s: float, *, duty: float = 0.1, most_s: float = 10.0) -> float:
    """The wait before the next tick: ``base_s``, or longer so that computing the model takes at most
    ``duty`` of the time (never more than ``most_s``)."""
    return min(most_s, max(base_s, compute_s / duty))


def sse_event(name: str, data: object) -> bytes:
    """One server-sent event (JSON data on one line: JSON escapes newlines, so no value can end the event
    or forge another)."""
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


class Baselines:
    """What each page was rendered with, for its stream's first comparison: kept :data:`ttl_s` at most,
    :data:`limit` at once (a baseline not found makes the stream send every row once)."""

    def __init__(self, ttl_s: float = 120.0, limit: int = 256) -> None:
        self.ttl_s = ttl_s
        self.limit = limit
        self._kept: dict[str, tuple[float, Rows]] = {}

    def keep(self, rows: Rows) -> str:
        now = time.monotonic()
        for k in [k for k, (t, _) in self._kept.items() if now - t > self.ttl_s]:
            del self._kept[k]
        while len(self._kept) >= self.limit:
            del self._kept[next(iter(self._kept))]
        vid = secrets.token_urlsafe(12)
        self._kept[vid] = (now, rows)
        return vid

    def take(self, vid: str) -> Rows:
        kept = self._kept.pop(vid, None)
        return kept[1] if kept is not None else {}


async def ticking(compute: Callable[[], Awaitable[tuple[Rows, dict[str, Any]]]], baseline: Rows, base_s: float,
                  cost_s: Callable[[], float] | None = None) -> AsyncIterator[dict[str, Any]]:
    """Deltas of ``compute``'s rows against the last ones sent (first: ``baseline``), one per tick when
    something changed; ``compute`` also returns extra fields sent with every delta (a page's figures).
    ``cost_s`` is what computing the model last cost (when shared, :meth:`Shared.cost_s`), else it is timed."""
    last, extra_sent = baseline, None
    while True:
        started = time.monotonic()
        rows, extra = await compute()
        spent = cost_s() if cost_s is not None else time.monotonic() - started
        delta = diff(last, rows)
        if delta is not None or (extra and extra != extra_sent):
            yield {**(delta or {"upsert": {}, "remove": []}), **extra}
            last, extra_sent = rows, extra
        await asyncio.sleep(next_tick(base_s, spent))
