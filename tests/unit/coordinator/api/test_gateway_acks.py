"""Agents' task-status events: applied concurrently across tasks, acknowledged strictly in order."""

from __future__ import annotations

import asyncio

import pytest

from common.logging import get_logger
from common.pb.gptrm.v1 import agent_pb2, types_pb2
from coordinator.api.gateway import AgentGatewayService, _folded


async def _acks(results: list[tuple[int, float, Exception | None]]) -> list[int | None]:
    """Feed events (seq, seconds its application takes, its error) to the acker; return what reached the outbox
    (an ack's seq; None: the stream was ended)."""
    applied: asyncio.Queue = asyncio.Queue()
    outbox: asyncio.Queue = asyncio.Queue()

    async def apply(delay: float, error: Exception | None) -> None:
        await asyncio.sleep(delay)
        if error is not None:
            raise error

    for seq, delay, error in results:
        applied.put_nowait((seq, asyncio.create_task(apply(delay, error))))
    acker = asyncio.create_task(AgentGatewayService._ack_in_order(applied, outbox, get_logger("test")))
    done, _ = await asyncio.wait([acker], timeout=0.5)
    acker.cancel()
    got: list[int | None] = []
    while not outbox.empty():
        got.append(outbox.get_nowait().event_ack.up_to_seq)
    if done and acker.exception() is not None:
        got.append(None)
    return got


def test_acks_follow_event_order_whatever_finishes_first() -> None:
    """Events 2 and 3 applied before event 1: nothing is acknowledged until 1 is, then one ack covers all three
    (acks are cumulative)."""
    assert asyncio.run(_acks([(1, 0.05, None), (2, 0.0, None), (3, 0.01, None)])) == [3]


def test_events_applied_one_after_the_other_are_acknowledged_one_by_one() -> None:
    """Each event applied after the acker took the one before: one ack each, in order."""
    assert asyncio.run(_acks([(1, 0.0, None), (2, 0.03, None), (3, 0.06, None)])) == [1, 2, 3]


def test_one_ack_covers_the_events_applied_together_up_to_one_not_applied() -> None:
    """Events 1 and 2 applied, 3 failed, 4 applied: one ack up to 2, and the stream ends."""
    assert asyncio.run(_acks([(1, 0.03, None), (2, 0.0, None), (3, 0.0, RuntimeError("etcd down")),
                              (4, 0.0, None)])) == [2, None]


def test_nothing_after_an_event_not_applied_is_acknowledged() -> None:
    """Event 2 fails: 1 is acknowledged, 3 (applied) is not, and the stream ends (the agent re-sends 2 and 3)."""
    assert asyncio.run(_acks([(1, 0.0, None), (2, 0.01, RuntimeError("etcd down")), (3, 0.0, None)])) == [1, None]


def test_events_of_one_task_apply_one_after_the_other() -> None:
    """An event chained after its task's previous one starts only once that one is done, and fails with it."""
    order: list[str] = []

    async def run() -> None:
        async def first() -> None:
            await asyncio.sleep(0.02)
            order.append("first")
            raise RuntimeError("not applied")

        gateway = AgentGatewayService.__new__(AgentGatewayService)
        before = asyncio.create_task(first())
        status = agent_pb2.TaskStatus(task_id="t-1", event_seq=2)
        with pytest.raises(RuntimeError):
            await gateway._apply_after(before, None, status, get_logger("test"))  # type: ignore[arg-type]

    asyncio.run(run())
    assert order == ["first"]


def test_a_start_folds_into_the_same_tasks_next_event_in_the_report() -> None:
    """A start followed (later in the same report, other tasks' events between) by its own task's running is left
    out when the reconciler says it folds; the last event of a task, and one that does not fold, stay."""
    s = types_pb2.TASK_STATE_STARTING
    r = types_pb2.TASK_STATE_RUNNING
    events = [agent_pb2.TaskStatus(task_id=t, state=st, event_seq=i + 1)
              for i, (t, st) in enumerate([("a", s), ("b", s), ("a", r), ("b", r), ("c", s)])]

    def folds(first: agent_pb2.TaskStatus, then: agent_pb2.TaskStatus) -> bool:
        return first.state == s and then.state == r and first.task_id != "b"

    assert [(e.task_id, e.event_seq) for e in _folded(events, folds)] == [("b", 2), ("a", 3), ("b", 4), ("c", 5)]
