"""The leader's log relay: requests go to the task's node, only that node's answers come back, errors are named."""

from __future__ import annotations

import asyncio

import pytest

from common.errors import NotFound, Unavailable, ValidationError
from common.pb.gptrm.v1 import admin_pb2, agent_pb2, types_pb2
from coordinator.dispatch.logs import MAX_QUEUED, LogRelay
from coordinator.monitor.nodes import NodeRegistry


def _task(node_id: str = "n1") -> types_pb2.Task:
    task = types_pb2.Task(id="t1")
    if node_id:
        task.allocation.nodes.add(node_id=node_id)
    return task


def _setup() -> tuple[LogRelay, NodeRegistry, asyncio.Queue]:
    registry = NodeRegistry(1.0, 30.0)
    outbox: asyncio.Queue = asyncio.Queue()
    registry.connect(types_pb2.NodeInventory(node_id="n1"), outbox)
    return LogRelay(registry, new_id=lambda: "req-1"), registry, outbox


async def _collect(relay: LogRelay, task: types_pb2.Task, **kw: object) -> list[admin_pb2.TaskLogChunk]:
    return [c async for c in relay.stream(task, kw.get("tail", 0), kw.get("follow", False))]  # type: ignore[arg-type]


class TestLogRelay:
    def test_request_reaches_the_node_and_chunks_come_back(self) -> None:
        """The node's outbox gets a LogRequest; its chunks come back numbered with the node id, eof ends the stream."""
        async def scenario() -> tuple[list[admin_pb2.TaskLogChunk], agent_pb2.LogRequest]:
            relay, _, outbox = _setup()
            reader = asyncio.create_task(_collect(relay, _task(), tail=2))
            req = (await outbox.get()).log_request
            relay.deliver("n1", agent_pb2.LogChunk(request_id=req.request_id, data=b"a\n"))
            relay.deliver("n1", agent_pb2.LogChunk(request_id=req.request_id, data=b"b\n"))
            relay.deliver("n1", agent_pb2.LogChunk(request_id=req.request_id, eof=True))
            return await asyncio.wait_for(reader, 5), req

        chunks, req = asyncio.run(scenario())
        assert req.task_id == "t1" and req.tail_lines == 2 and not req.follow
        assert [(c.seq, c.data, c.node_id) for c in chunks] == [(1, b"a\n", "n1"), (2, b"b\n", "n1")]

    def test_other_nodes_cannot_answer(self) -> None:
        """A chunk for the request from a different node is dropped."""
        async def scenario() -> list[admin_pb2.TaskLogChunk]:
            relay, _, outbox = _setup()
            reader = asyncio.create_task(_collect(relay, _task()))
            req = (await outbox.get()).log_request
            relay.deliver("n2", agent_pb2.LogChunk(request_id=req.request_id, data=b"forged\n"))
            relay.deliver("n1", agent_pb2.LogChunk(request_id=req.request_id, data=b"real\n", eof=True))
            return await asyncio.wait_for(reader, 5)

        assert [c.data for c in asyncio.run(scenario())] == [b"real\n"]

    def test_node_without_log_is_not_found(self) -> None:
        """The agent's not_found answer becomes NotFound naming the node."""
        async def scenario() -> None:
            relay, _, outbox = _setup()
            reader = asyncio.create_task(_collect(relay, _task()))
            req = (await outbox.get()).log_request
            relay.deliver("n1", agent_pb2.LogChunk(request_id=req.request_id, eof=True, not_found=True,
                                                   error="no output log for task 't1'"))
            await asyncio.wait_for(reader, 5)

        with pytest.raises(NotFound, match="n1"):
            asyncio.run(scenario())

    def test_disconnected_node_is_unavailable(self) -> None:
        """A task whose node has no stream is refused with Unavailable naming task and node."""
        async def scenario() -> None:
            relay, registry, _ = _setup()
            registry.disconnect("n1", registry.get("n1").stream_id)  # type: ignore[union-attr]
            await _collect(relay, _task())

        with pytest.raises(Unavailable, match=r"'t1'.*'n1'"):
            asyncio.run(scenario())

    def test_task_that_never_ran_is_not_found(self) -> None:
        """A task without an allocation has no output: NotFound."""
        async def scenario() -> None:
            relay, _, _ = _setup()
            await _collect(relay, _task(node_id=""))

        with pytest.raises(NotFound, match="has not run"):
            asyncio.run(scenario())

    def test_tail_bound(self) -> None:
        """A tail over the bound is a ValidationError naming tail_lines."""
        async def scenario() -> None:
            relay, _, _ = _setup()
            await _collect(relay, _task(), tail=10**6)

        with pytest.raises(ValidationError, match="tail_lines"):
            asyncio.run(scenario())

    def test_stream_end_fails_its_sessions(self) -> None:
        """When the stream that carried the request ends, the reader gets Unavailable."""
        async def scenario() -> None:
            relay, _, outbox = _setup()
            reader = asyncio.create_task(_collect(relay, _task(), follow=True))
            await outbox.get()
            relay.stream_ended("n1", outbox)
            await asyncio.wait_for(reader, 5)

        with pytest.raises(Unavailable, match="disconnected"):
            asyncio.run(scenario())

    def test_client_going_away_cancels_on_the_agent(self) -> None:
        """Closing the reader before eof sends a cancel for its request and forgets the session."""
        async def scenario() -> tuple[agent_pb2.LogRequest, int]:
            relay, _, outbox = _setup()
            gen = relay.stream(_task(), 0, True)
            first = asyncio.create_task(anext(gen))
            req = (await outbox.get()).log_request
            relay.deliver("n1", agent_pb2.LogChunk(request_id=req.request_id, data=b"x\n"))
            await first
            await gen.aclose()
            return (await outbox.get()).log_request, len(relay)

        cancel, sessions = asyncio.run(scenario())
        assert cancel.cancel and cancel.request_id == "req-1" and sessions == 0

    def test_slow_reader_is_ended_not_buffered_without_bound(self) -> None:
        """More than MAX_QUEUED unread chunks end the session with Unavailable instead of growing."""
        async def scenario() -> None:
            relay, _, outbox = _setup()
            gen = relay.stream(_task(), 0, True)
            first = asyncio.create_task(anext(gen))
            req = (await outbox.get()).log_request
            for _ in range(MAX_QUEUED + 5):
                relay.deliver("n1", agent_pb2.LogChunk(request_id=req.request_id, data=b"x\n"))
            await first
            async for _ in gen:
                pass

        with pytest.raises(Unavailable, match="fell more than"):
            asyncio.run(scenario())
