"""The leader's session relay: the open goes to the task's node, output comes back acknowledged, input keeps to
its window, only that node may answer, and a node past its window or gone ends the session."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from common.errors import NotFound, Unavailable, ValidationError
from common.pb.gptrm.v1 import admin_pb2, agent_pb2, types_pb2
from coordinator.dispatch.sessions import IN_WINDOW, MAX_QUEUED, SessionRelay
from coordinator.monitor.nodes import NodeRegistry


def _task(state: types_pb2.TaskState = types_pb2.TASK_STATE_RUNNING) -> types_pb2.Task:
    task = types_pb2.Task(id="t1", state=state)
    task.allocation.nodes.add(node_id="n1")
    return task


def _setup() -> tuple[SessionRelay, NodeRegistry, asyncio.Queue]:
    registry = NodeRegistry(1.0, 30.0)
    outbox: asyncio.Queue = asyncio.Queue()
    registry.connect(types_pb2.NodeInventory(node_id="n1"), outbox)
    return SessionRelay(registry, new_id=lambda: "s-1"), registry, outbox


async def _inputs(items: list[admin_pb2.TaskSessionInput], hold: asyncio.Event) -> AsyncIterator[
        admin_pb2.TaskSessionInput]:
    for item in items:
        yield item
    await hold.wait()   # the client keeps its side open while it reads


async def _run(relay: SessionRelay, opened: admin_pb2.TaskSessionOpen, inputs: AsyncIterator[
        admin_pb2.TaskSessionInput], task: types_pb2.Task | None = None) -> list[admin_pb2.TaskSessionOutput]:
    return [o async for o in relay.run(task or _task(), opened, inputs, "alice")]


def _requests(outbox: asyncio.Queue) -> list[agent_pb2.SessionRequest]:
    out = []
    while not outbox.empty():
        out.append(outbox.get_nowait().session_request)
    return out


class TestSessionRelay:
    def test_exec_reaches_the_node_and_its_output_and_exit_code_come_back_acknowledged(self) -> None:
        async def scenario() -> tuple[list[admin_pb2.TaskSessionOutput], list[agent_pb2.SessionRequest]]:
            relay, _, outbox = _setup()
            hold = asyncio.Event()
            reader = asyncio.create_task(_run(relay, admin_pb2.TaskSessionOpen(task_id="t1", argv=["id"]),
                                              _inputs([], hold)))
            opened = (await outbox.get()).session_request
            relay.deliver("n2", agent_pb2.SessionChunk(session_id="s-1", data=b"forged"))
            relay.deliver("n1", agent_pb2.SessionChunk(session_id="s-1", data=b"uid=1\n"))
            ack = (await asyncio.wait_for(outbox.get(), 5)).session_request   # once the client took it
            relay.deliver("n1", agent_pb2.SessionChunk(session_id="s-1", exited=True, exit_code=5, has_exit_code=True))
            out = await asyncio.wait_for(reader, 5)
            return out, [opened, ack, *_requests(outbox)]

        out, reqs = asyncio.run(scenario())
        assert reqs[0].open and list(reqs[0].argv) == ["id"] and reqs[0].principal == "alice"
        assert [o.node_id for o in out[:1]] == ["n1"]
        assert [(o.data, o.exited, o.exit_code) for o in out[1:]] == [(b"uid=1\n", False, 0), (b"", True, 5)]
        assert [r.output_acked for r in reqs[1:]] == [1]

    def test_input_keeps_to_its_window_until_acknowledged(self) -> None:
        """Past IN_WINDOW unacknowledged input messages the relay stops reading the client; an ack lets more go."""
        async def scenario() -> tuple[int, int]:
            relay, _, outbox = _setup()
            hold = asyncio.Event()
            items = [admin_pb2.TaskSessionInput(data=b"x") for _ in range(IN_WINDOW + 3)]
            reader = asyncio.create_task(_run(relay, admin_pb2.TaskSessionOpen(task_id="t1", argv=["cat"]),
                                              _inputs(items, hold)))
            await asyncio.wait_for(outbox.get(), 5)   # the open
            sent = [await asyncio.wait_for(outbox.get(), 5) for _ in range(IN_WINDOW)]
            await asyncio.sleep(0.05)   # room for a wrongly sent one more
            first = len(sent) + sum(bool(r.data) for r in _requests(outbox))
            relay.deliver("n1", agent_pb2.SessionChunk(session_id="s-1", input_acked=2))
            more = len([await asyncio.wait_for(outbox.get(), 5) for _ in range(2)])
            await asyncio.sleep(0.05)
            more += sum(bool(r.data) for r in _requests(outbox))
            relay.deliver("n1", agent_pb2.SessionChunk(session_id="s-1", exited=True))
            hold.set()
            await asyncio.wait_for(reader, 5)
            return first, more

        assert asyncio.run(scenario()) == (IN_WINDOW, 2)

    def test_a_node_past_its_window_or_gone_ends_the_session(self) -> None:
        async def past_window() -> None:
            relay, _, outbox = _setup()
            hold = asyncio.Event()
            reader = asyncio.create_task(_run(relay, admin_pb2.TaskSessionOpen(task_id="t1", argv=["yes"]),
                                              _inputs([], hold)))
            await outbox.get()
            for _ in range(MAX_QUEUED + 1):   # the client reads nothing meanwhile: the relay holds them
                relay.deliver("n1", agent_pb2.SessionChunk(session_id="s-1", data=b"y\n"))
            await asyncio.wait_for(reader, 5)

        with pytest.raises(Unavailable, match="window"):
            asyncio.run(past_window())

        async def gone() -> None:
            relay, _, outbox = _setup()
            hold = asyncio.Event()
            reader = asyncio.create_task(_run(relay, admin_pb2.TaskSessionOpen(task_id="t1"), _inputs([], hold)))
            await outbox.get()
            relay.stream_ended("n1", outbox)
            await asyncio.wait_for(reader, 5)

        with pytest.raises(Unavailable, match="disconnected"):
            asyncio.run(gone())

    def test_refusals_name_the_field(self) -> None:
        relay, _, _ = _setup()
        hold = asyncio.Event()
        with pytest.raises(NotFound, match="not running"):
            asyncio.run(_run(relay, admin_pb2.TaskSessionOpen(task_id="t1"), _inputs([], hold),
                             _task(types_pb2.TASK_STATE_PENDING)))
        with pytest.raises(ValidationError, match=r"^open.rank"):
            asyncio.run(_run(relay, admin_pb2.TaskSessionOpen(task_id="t1", rank=1), _inputs([], hold)))
        with pytest.raises(ValidationError, match=r"^open.hangup_on_close"):
            asyncio.run(_run(relay, admin_pb2.TaskSessionOpen(task_id="t1", argv=["x"], hangup_on_close=True),
                             _inputs([], hold)))
