"""Relaying task output from agents to Admin ``TaskLogs`` callers.

The leader asks the agent of the node a task runs (or ran) on with a ``LogRequest`` on that
node's stream and hands the ``LogChunk`` answers, matched by request id, to the caller. A node
may answer only the requests sent to it. Each session buffers at most :data:`MAX_QUEUED`
chunks: a caller that reads slower than the node sends ends with an error rather than
making the coordinator hold an unbounded backlog (the agent bounds its own rate). When the
node's stream ends, its sessions end with :class:`~common.errors.Unavailable`.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from common.errors import NotFound, Unavailable, ValidationError
from common.logging import get_logger
from common.pb.gptrm.v1 import admin_pb2, agent_pb2, types_pb2
from coordinator.monitor.nodes import NodeRegistry, StreamQueue

__all__ = ["MAX_QUEUED", "MAX_SESSIONS", "MAX_TAIL_LINES", "LogRelay"]

MAX_QUEUED = 64
MAX_SESSIONS = 64
MAX_TAIL_LINES = 100_000


@dataclass
class _Session:
    request_id: str
    node_id: str
    task_id: str
    outbox: StreamQueue
    queue: asyncio.Queue[agent_pb2.LogChunk | None] = field(default_factory=asyncio.Queue)
    error: Exception | None = None
    ended: bool = False

    def end(self, error: Exception | None = None) -> None:
        if not self.ended:
            self.ended = True
            self.error = error
            self.queue.put_nowait(None)


class LogRelay:
    """Log sessions of one coordinator replica.

    :param registry: the node table (each connected node's stream outbox).
    :param new_id: request ids (random by default).
    """

    def __init__(self, registry: NodeRegistry, new_id: Callable[[], str] = lambda: os.urandom(8).hex()) -> None:
        self._registry = registry
        self._new_id = new_id
        self._sessions: dict[str, _Session] = {}
        self._log = get_logger("coordinator").bind(component="log_relay")

    def __len__(self) -> int:
        return len(self._sessions)

    async def stream(self, task: types_pb2.Task, tail_lines: int,
                     follow: bool, rank: int = 0) -> AsyncIterator[admin_pb2.TaskLogChunk]:
        """The output of one part of the task (rank 0 by default) from its node's agent, chunk by chunk.

        :raises ValidationError: tail_lines out of range, or no such rank.
        :raises NotFound: the task never ran on a node, or its node has no log for it.
        :raises Unavailable: the node's agent is not connected, or went away meanwhile.
        """
        if tail_lines > MAX_TAIL_LINES:
            raise ValidationError("tail_lines", f"at most {MAX_TAIL_LINES}, got {tail_lines}")
        nodes = [na.node_id for na in task.allocation.nodes] or [p.node_id for p in task.parts]
        if not nodes:
            raise NotFound(f"task {task.id!r} has not run on any node yet: it has no output")
        if rank >= len(nodes):
            raise ValidationError("rank", f"task {task.id!r} has {len(nodes)} part(s) (ranks 0..{len(nodes) - 1}), "
                                          f"not rank {rank}")
        node_id = nodes[rank]
        entry = self._registry.get(node_id)
        if entry is None or entry.outbox is None:
            raise Unavailable(f"task {task.id!r} ran on node {node_id!r}, whose agent is not connected")
        if len(self._sessions) >= MAX_SESSIONS:
            raise Unavailable(f"more than {MAX_SESSIONS} log readers on this coordinator; try again later")
        outbox = entry.outbox
        session = _Session(self._new_id(), node_id, task.id, outbox)
        self._sessions[session.request_id] = session
        outbox.put_nowait(agent_pb2.CoordinatorMessage(log_request=agent_pb2.LogRequest(
            request_id=session.request_id, task_id=task.id, tail_lines=tail_lines, follow=follow)))
        seq = 0
        try:
            while True:
                chunk = await session.queue.get()
                if chunk is None:
                    break
                seq += 1
                yield admin_pb2.TaskLogChunk(task_id=task.id, node_id=node_id, seq=seq, data=chunk.data)
            if session.error is not None:
                raise session.error
        finally:
            self._sessions.pop(session.request_id, None)
            if not session.ended and self._registry.get(node_id) is not None and entry.outbox is outbox:
                # The caller went away first: the agent stops reading.
                outbox.put_nowait(agent_pb2.CoordinatorMessage(log_request=agent_pb2.LogRequest(
                    request_id=session.request_id, cancel=True)))

    def deliver(self, node_id: str, chunk: agent_pb2.LogChunk) -> None:
        """A node's answer; chunks for requests this node was not sent are dropped."""
        session = self._sessions.get(chunk.request_id)
        if session is None or session.node_id != node_id or session.ended:
            return
        if chunk.data:
            if session.queue.qsize() >= MAX_QUEUED:
                self._log.warning("log_session_ended", task_id=session.task_id, node_id=node_id,
                                  reason="the reader is slower than the node sends")
                session.end(Unavailable(f"task {session.task_id!r}: the log reader fell more than {MAX_QUEUED} "
                                        f"chunks behind node {node_id!r}; read again with --tail"))
                return
            session.queue.put_nowait(chunk)
        if chunk.error:
            where = f"node {node_id!r}: {chunk.error}"
            session.end(NotFound(where) if chunk.not_found else Unavailable(where))
        elif chunk.eof:
            session.end()

    def stream_ended(self, node_id: str, outbox: StreamQueue) -> None:
        """A node's stream (the one with this outbox) ended: the sessions it carried end with Unavailable."""
        for session in list(self._sessions.values()):
            if session.node_id == node_id and session.outbox is outbox:
                session.end(Unavailable(f"node {node_id!r}, which holds task {session.task_id!r}'s log, "
                                        "disconnected"))
