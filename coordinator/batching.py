"""Concurrent calls coalesced into batches: one etcd transaction for many submits.

A call that finds nothing in flight is sent at once, alone (no added latency when the load is
light); calls that arrive while a batch is out wait for it, and the next batch takes all of them
that fit (up to ``max_batch``). Under load each etcd round trip then carries many calls instead of
one. More batches go at once (up to ``max_in_flight``) only when a full one waits: a backlog is
worked off in parallel, while a steady stream is not split into many small transactions (each
costs the leader a thread's round trip and every etcd member a raft entry, whatever its size).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

__all__ = ["Batcher"]

I = TypeVar("I")  # noqa: E741
O = TypeVar("O")  # noqa: E741


class Batcher(Generic[I, O]):
    """Runs ``run`` on batches of the items handed to :meth:`call`.

    Example::

        creates = Batcher(lambda items: leadership.write(store.create_submits, items), max_batch=50)
        stored = await creates.call((task, request_id))   # the result for this item, or its exception

    :param run: takes a batch and returns one result per item, in order: a value, or an exception to raise to
        that item's caller. An exception ``run`` itself raises goes to every caller of the batch.
    :param max_batch: items per batch at most.
    :param max_in_flight: batches running at once at most; beyond the first, each starts only with a full batch.
    """

    def __init__(self, run: Callable[[list[I]], Awaitable[Sequence[O | BaseException]]], *, max_batch: int = 50,
                 max_in_flight: int = 4) -> None:
        if max_batch < 1 or max_in_flight < 1:
            raise ValueError("max_batch and max_in_flight must be at least 1")
        self._run, self._max_batch, self._max_in_flight = run, max_batch, max_in_flight
        self._waiting: list[tuple[I, asyncio.Future[O]]] = []
        self._in_flight = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self.batches = 0
        """Batches run so far."""

    async def call(self, item: I) -> O:
        """Run ``item`` in the next batch; returns its result or raises its exception."""
        future: asyncio.Future[O] = asyncio.get_running_loop().create_future()
        self._waiting.append((item, future))
        self._start()
        return await future

    def _start(self) -> None:
        while self._waiting and self._in_flight < self._max_in_flight \
                and (self._in_flight == 0 or len(self._waiting) >= self._max_batch):
            batch, self._waiting = self._waiting[:self._max_batch], self._waiting[self._max_batch:]
            self._in_flight += 1
            task = asyncio.create_task(self._flush(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _flush(self, batch: list[tuple[I, asyncio.Future[O]]]) -> None:
        try:
            self.batches += 1
            results = await self._run([item for item, _f in batch])
        except Exception as e:  # handed to every caller of the batch
            for _item, future in batch:
                if not future.done():
                    future.set_exception(e)
        except BaseException:   # cancelled (shutdown): so are its callers
            for _item, future in batch:
                future.cancel()
            raise
        else:
            for (_item, future), result in zip(batch, results, strict=True):
                if future.done():
                    continue
                if isinstance(result, BaseException):
                    future.set_exception(result)
                else:
                    future.set_result(result)
        finally:
            self._in_flight -= 1
            self._start()
