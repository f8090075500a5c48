"""Batcher: concurrent calls coalesced into batches, each caller getting its own result or error."""

from __future__ import annotations

import asyncio

import pytest

from coordinator.batching import Batcher


async def _next_batch() -> None:
    """The first call goes alone at once; the calls made while it runs go together in one more batch, and every
    caller gets its own result, or its own exception."""
    release = asyncio.Event()
    batches: list[list[int]] = []

    async def run(items: list[int]) -> list[int | BaseException]:
        batches.append(items)
        if len(batches) == 1:
            await release.wait()
        return [ValueError(f"bad {i}") if i == 3 else i * 10 for i in items]

    b: Batcher[int, int] = Batcher(run, max_batch=10, max_in_flight=1)
    first = asyncio.create_task(b.call(0))
    await asyncio.sleep(0)
    rest = [asyncio.create_task(b.call(i)) for i in range(1, 5)]
    await asyncio.sleep(0)
    release.set()
    assert await first == 0
    results = await asyncio.gather(*rest, return_exceptions=True)
    assert batches == [[0], [1, 2, 3, 4]]
    assert results[:2] == [10, 20] and isinstance(results[2], ValueError) and results[3] == 40


async def _failed_batch() -> None:
    """An error of the whole batch reaches every caller in it; batches never exceed max_batch."""
    sizes: list[int] = []

    async def run(items: list[int]) -> list[int]:
        sizes.append(len(items))
        await asyncio.sleep(0)
        raise RuntimeError("etcd down")

    b: Batcher[int, int] = Batcher(run, max_batch=3, max_in_flight=1)
    results = await asyncio.gather(*(b.call(i) for i in range(8)), return_exceptions=True)
    assert all(isinstance(r, RuntimeError) for r in results)
    assert max(sizes) <= 3 and sum(sizes) == 8


async def _parallel_only_when_full() -> None:
    """While a batch runs, fewer waiting calls than a full batch wait for it (one transaction for them all,
    not one each); a full batch waiting starts beside it, up to max_in_flight."""
    release = asyncio.Event()
    batches: list[list[int]] = []

    async def run(items: list[int]) -> list[int]:
        batches.append(items)
        await release.wait()
        return items

    b: Batcher[int, int] = Batcher(run, max_batch=3, max_in_flight=2)
    calls = [asyncio.create_task(b.call(0))]
    await asyncio.sleep(0)
    calls += [asyncio.create_task(b.call(i)) for i in (1, 2)]
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert batches == [[0]]   # two waiting, a batch holds three: they wait for the first
    calls += [asyncio.create_task(b.call(i)) for i in range(3, 9)]
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert batches == [[0], [1, 2, 3]]   # a full batch went beside the first; the second slot is taken now
    release.set()
    assert await asyncio.gather(*calls) == list(range(9))
    assert batches == [[0], [1, 2, 3], [4, 5, 6], [7, 8]]


def test_a_second_batch_goes_at_once_only_when_full() -> None:
    """While a batch runs, fewer waiting calls than a full batch wait for it; a full batch starts beside it."""
    asyncio.run(_parallel_only_when_full())


def test_calls_arriving_while_a_batch_runs_go_in_the_next_one() -> None:
    """The first call goes alone at once; the calls made while it runs go together in one more batch, and every
    caller gets its own result, or its own exception."""
    asyncio.run(_next_batch())


def test_a_failed_batch_fails_each_of_its_callers_and_bounds_hold() -> None:
    """An error of the whole batch reaches every caller in it; batches never exceed max_batch."""
    asyncio.run(_failed_batch())


def test_bounds_are_checked() -> None:
    """A batch or in-flight bound below 1 is refused."""
    async def run(items: list[int]) -> list[int]:
        return items

    with pytest.raises(ValueError, match="max_batch"):
        Batcher(run, max_batch=0)
