"""The live streams' deltas, pacing and framing."""

from __future__ import annotations

import asyncio
import json

from coordinator.web.live import Baselines, diff, next_tick, sse_event, ticking
from coordinator.web.reader import Shared


def test_diff_sends_changed_and_removed_rows_only() -> None:
    assert diff({"a": 1, "b": 2}, {"a": 1, "b": 2}) is None
    assert diff({"a": 1, "b": 2}, {"a": 1, "b": 3, "c": 4}) == {"upsert": {"b": 3, "c": 4}, "remove": []}
    assert diff({"a": 1, "b": 2}, {"b": 2}) == {"upsert": {}, "remove": ["a"]}


def test_next_tick_grows_with_the_cost_of_the_model() -> None:
    assert next_tick(2.0, 0.01) == 2.0
    assert next_tick(2.0, 0.4) == 4.0   # at most 10 % of the time spent computing
    assert next_tick(2.0, 5.0) == 10.0   # and never longer than 10 s


def test_sse_event_is_one_event_whatever_the_data_holds() -> None:
    raw = sse_event("delta", {"m": "line\n\nevent: forged\ndata: x"}).decode()
    assert raw.count("\n\n") == 1 and raw.endswith("\n\n")
    assert json.loads(raw.split("data: ", 1)[1]) == {"m": "line\n\nevent: forged\ndata: x"}


def test_baselines_are_taken_once() -> None:
    kept = Baselines(limit=2)
    vid = kept.keep({"a": 1})
    assert kept.take(vid) == {"a": 1} and kept.take(vid) == {}
    ids = [kept.keep({"n": i}) for i in range(3)]
    assert kept.take(ids[0]) == {} and kept.take(ids[2]) == {"n": 2}


def test_ticking_starts_from_the_rendered_baseline() -> None:
    states = iter([({"a": 1, "b": 2}, {}), ({"a": 1, "b": 3}, {})])

    async def compute() -> tuple[dict[str, int], dict[str, str]]:
        return next(states)

    async def run() -> list[dict[str, object]]:
        out = []
        async for d in ticking(compute, {"a": 1, "b": 2}, 0.0):
            out.append(d)
            break
        return out
    assert asyncio.run(run()) == [{"upsert": {"b": 3}, "remove": []}]


def test_shared_computes_once_for_concurrent_callers() -> None:
    calls = 0

    async def compute() -> int:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.01)
        return calls

    async def run() -> list[int]:
        shared = Shared(ttl_s=60.0)
        first = await asyncio.gather(*(shared.get("k", compute) for _ in range(5)))
        return [*first, await shared.get("k", compute)]
    assert asyncio.run(run()) == [1] * 6 and calls == 1

