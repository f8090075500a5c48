"""Relaying interactive sessions (Admin ``Session``: attach, exec) between a client and a task's agent.

The leader opens a session on the stream of the node that runs the task's part with a
``SessionRequest`` (``open``), forwards the client's input as more of them and hands the agent's
``SessionChunk`` answers, matched by session id, back to the client (``docs/interactive.md``).

Every buffer is bounded, and a slow party slows only its own session:

- output: the agent sends at most ``agent.sessions.WINDOW`` chunks not yet acknowledged; the leader
  acknowledges each (``output_acked``) once its client has taken it, so a session holds at most that
  many here; an agent that sends more ends its session with an error (:data:`MAX_QUEUED`);
- input: at most :data:`IN_WINDOW` input messages of at most :data:`INPUT_BYTES` each are in flight
  to the agent per session; past that, the leader stops reading the client's stream (gRPC's flow
  control then holds the client), so the node's stream outbox never fills with one client's input.

When the node's stream ends, its sessions end with :class:`~common.errors.Unavailable`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from common.errors import NotFound, Unavailable, ValidationError
from common.logging import get_logger
from common.pb.gptrm.v1 import admin_pb2, agent_pb2, types_pb2
from coordinator.monitor.nodes import NodeRegistry, StreamQueue

__all__ = ["INPUT_BYTES", "IN_WINDOW", "MAX_QUEUED", "MAX_SESSIONS", "SessionRelay"]

IN_WINDOW = 8
INPUT_BYTES = 16 * 1024
MAX_QUEUED = 40
"""Output chunks a session may hold here: the agent's window (16) and its last message, with room to spare."""
MAX_SESSIONS = 64
MAX_ARGV = 256
_MAX_ARG_BYTES = 64 * 1024


@dataclass
class _Relay:
    session_id: str
    node_id: str
    task_id: str
    outbox: StreamQueue
    queue: asyncio.Queue[agent_pb2.SessionChunk | None] = field(default_factory=asyncio.Queue)
    in_flight: int = 0
    room: asyncio.Event = field(default_factory=asyncio.Event)
    error: Exception | None = None
    ended: bool = False

    def end(self, error: Exception | None = None) -> None:
        if not self.ended:
            self.ended = True
            self.error = error
            self.queue.put_nowait(None)
            self.room.set()

    def send(self, **fields: object) -> None:
        self.outbox.put_nowait(agent_pb2.CoordinatorMessage(session_request=agent_pb2.SessionRequest(
            session_id=self.session_id, task_id=self.task_id, **fields)))   # type: ignore[arg-type]


def _check_open(open_msg: admin_pb2.TaskSessionOpen) -> None:
    """:raises ValidationError: naming the field of the open message that is wrong."""
    if len(open_msg.argv) > MAX_ARGV:
        raise ValidationError("open.argv", f"at most {MAX_ARGV} arguments")
    if sum(len(a) for a in open_msg.argv) > _MAX_ARG_BYTES:
        raise ValidationError("open.argv", f"longer than {_MAX_ARG_BYTES} bytes in all")
    for i, a in enumerate(open_msg.argv):
        if "\0" in a:
            raise ValidationError(f"open.argv[{i}]", "holds a NUL character")
    if open_msg.argv and open_msg.hangup_on_close:
        raise ValidationError("open.hangup_on_close", "is for attaching to a task's terminal, not exec")
    for name in ("rows", "cols"):
        if getattr(open_msg, name) > 9999:
            raise ValidationError(f"open.{name}", "at most 9999")


class SessionRelay:
    """Interactive sessions of one coordinator replica (the leader's: agents stream to it).

    :param registry: the node table (each connected node's stream outbox).
    :param new_id: session ids (random by default).
    """

    def __init__(self, registry: NodeRegistry, new_id: Callable[[], str] = lambda: os.urandom(8).hex()) -> None:
        self._registry = registry
        self._new_id = new_id
        self._sessions: dict[str, _Relay] = {}
        self._log = get_logger("coordinator").bind(component="session_relay")

    def __len__(self) -> int:
        return len(self._sessions)

    async def run(self, task: types_pb2.Task, open_msg: admin_pb2.TaskSessionOpen,
                  inputs: AsyncIterator[admin_pb2.TaskSessionInput],
                  principal: str) -> AsyncIterator[admin_pb2.TaskSessionOutput]:
        """One session with the agent of the task's part ``open_msg.rank``: its output, as it comes.

        :raises ValidationError: a bad open message, or no such rank.
        :raises NotFound: the task does not run on a node.
        :raises Unavailable: the node's agent is not connected, went away, or refused the session.
        """
        _check_open(open_msg)
        nodes = [na.node_id for na in task.allocation.nodes]
        if task.state != types_pb2.TASK_STATE_RUNNING or not nodes:
            state = types_pb2.TaskState.Name(task.state).removeprefix("TASK_STATE_").lower()
            raise NotFound(f"task {task.id!r} is not running (it is {state})")
        if open_msg.rank >= len(nodes):
            raise ValidationError("open.rank", f"task {task.id!r} has {len(nodes)} part(s) "
                                               f"(ranks 0..{len(nodes) - 1}), not rank {open_msg.rank}")
        node_id = nodes[open_msg.rank]
        entry = self._registry.get(node_id)
        if entry is None or entry.outbox is None:
            raise Unavailable(f"task {task.id!r} runs on node {node_id!r}, whose agent is not connected")
        if len(self._sessions) >= MAX_SESSIONS:
            raise Unavailable(f"more than {MAX_SESSIONS} sessions on this coordinator; try again later")
        relay = _Relay(self._new_id(), node_id, task.id, entry.outbox)
        relay.room.set()
        self._sessions[relay.session_id] = relay
        kind = "exec" if open_msg.argv else "attach"
        self._log.info("session_opened", session_id=relay.session_id, task_id=task.id, node_id=node_id, kind=kind,
                       principal=principal, rank=open_msg.rank)
        relay.send(open=True, argv=list(open_msg.argv), pty=open_msg.pty, rows=open_msg.rows, cols=open_msg.cols,
                   hangup_on_close=open_msg.hangup_on_close, principal=principal)
        pump = asyncio.ensure_future(self._pump(relay, inputs))
        try:
            yield admin_pb2.TaskSessionOutput(node_id=node_id)
            while True:
                chunk = await relay.queue.get()
                if chunk is None:
                    break
                yield admin_pb2.TaskSessionOutput(data=chunk.data, stderr=chunk.stderr, exited=chunk.exited,
                                                  exit_code=chunk.exit_code)
                if chunk.data and not relay.ended:
                    relay.send(output_acked=1)
            if relay.error is not None:
                raise relay.error
        finally:
            pump.cancel()
            self._sessions.pop(relay.session_id, None)
            still = self._registry.get(node_id)
            if not relay.ended and still is not None and still.outbox is relay.outbox:
                relay.send(close=True)   # the client went away first: the agent ends its side
            self._log.info("session_ended", session_id=relay.session_id, task_id=task.id, node_id=node_id,
                           reason=str(relay.error) if relay.error else "")

    async def _pump(self, relay: _Relay, inputs: AsyncIterator[admin_pb2.TaskSessionInput]) -> None:
        """The client's input to the agent, within the input window."""
        with contextlib.suppress(asyncio.CancelledError, Exception):
            async for msg in inputs:
                pieces: list[dict[str, object]] = [
                    {"data": msg.data[i:i + INPUT_BYTES]} for i in range(0, len(msg.data), INPUT_BYTES)]
                if msg.rows and msg.cols:
                    pieces.append({"resize": True, "rows": min(msg.rows, 9999), "cols": min(msg.cols, 9999)})
                if msg.eof:
                    pieces.append({"eof": True})
                for piece in pieces:
                    while relay.in_flight >= IN_WINDOW and not relay.ended:
                        relay.room.clear()
                        await relay.room.wait()
                    if relay.ended:
                        return
                    relay.in_flight += 1
                    relay.send(**piece)

    def deliver(self, node_id: str, chunk: agent_pb2.SessionChunk) -> None:
        """A node's answer; chunks for sessions this node was not sent are dropped. Never blocks."""
        relay = self._sessions.get(chunk.session_id)
        if relay is None or relay.node_id != node_id or relay.ended:
            return
        if chunk.input_acked:
            relay.in_flight = max(0, relay.in_flight - chunk.input_acked)
            relay.room.set()
        if chunk.error:
            relay.end(Unavailable(f"node {node_id!r}: {chunk.error}"))
            return
        if chunk.data or chunk.exited:
            if relay.queue.qsize() >= MAX_QUEUED:
                self._log.warning("session_ended", session_id=relay.session_id, task_id=relay.task_id,
                                  node_id=node_id, reason="the agent sent past its window")
                relay.end(Unavailable(f"node {node_id!r} sent more session output than its window"))
                return
            relay.queue.put_nowait(chunk)
            if chunk.exited:
                relay.ended = True
                relay.queue.put_nowait(None)
                relay.room.set()

    def stream_ended(self, node_id: str, outbox: StreamQueue) -> None:
        """A node's stream (the one with this outbox) ended: the sessions it carried end with Unavailable."""
        for relay in list(self._sessions.values()):
            if relay.node_id == node_id and relay.outbox is outbox:
                relay.end(Unavailable(f"node {node_id!r}, which runs task {relay.task_id!r}, disconnected"))
