"""Task output logs on the agent, read back by tail and follow.

A task's stdout and stderr are written, interleaved as the task wrote them, by the agent's log
pump (:mod:`agent.logpump`) into ``<state_dir>/tasks/<id>/output.log``, rotated to
``output.log.1``, in a directory only root can write (:mod:`agent.taskfs`). Reading opens each
file without following a link and only if it is a regular file of the agent's own, so nothing a
task plants is ever read back.

:class:`LogService` answers the coordinator's ``LogRequest``: the last N lines, then, with
``follow``, what the task writes until it ends, as ``LogChunk`` messages of at most
:data:`CHUNK_BYTES` (cut after a newline where there is one) at most
:data:`RATE_BYTES_PER_S` per request, and at most :data:`MAX_FOLLOWERS` requests at a time.
"""

from __future__ import annotations

import asyncio
import os
import stat
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.logging import get_logger
from common.pb.gptrm.v1 import agent_pb2

__all__ = ["CHUNK_BYTES", "MAX_FOLLOWERS", "MAX_TAIL_LINES", "RATE_BYTES_PER_S", "Cursor", "LogService", "TaskLog",
           "valid_task_id"]

CHUNK_BYTES = 64 * 1024
RATE_BYTES_PER_S = 1024 * 1024
MAX_FOLLOWERS = 16
MAX_TAIL_LINES = 100_000
_MAX_TAIL_BYTES = 8 * 1024 * 1024   # a tail of N lines reads at most this much
_POLL_S = 0.25
_BLOCK = 64 * 1024


def valid_task_id(task_id: str) -> bool:
    """A task id that names one directory under ``tasks/`` (never a path out of it)."""
    return (0 < len(task_id) <= 253 and task_id not in (".", "..")
            and not any(c.isspace() or c in "/\\\0" for c in task_id))


class TaskLog:
    """One task's output log: ``output.log`` and its rotated predecessor ``output.log.1``.

    :param path: the live file (``.../output.log``).
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.rotated = self.path.with_name(self.path.name + ".1")

    def exists(self) -> bool:
        return _own_file(self.path) is not None or _own_file(self.rotated) is not None

    def size(self) -> int:
        st = _own_file(self.path)
        return st.st_size if st is not None else 0

    def generation(self) -> tuple[int, int] | None:
        """Which rotation the live file is in: the rotated copy's identity (each rotation makes a new one)."""
        st = _own_file(self.rotated)
        return (st.st_ino, st.st_mtime_ns) if st is not None else None

    def tail(self, lines: int, limit: int = _MAX_TAIL_BYTES) -> tuple[bytes, Cursor]:
        """The last ``lines`` lines (0: everything retained, up to ``limit`` bytes) and where in the
        live file they end (where a follower goes on)."""
        gen = self.generation()
        end = self.size()
        data = b""
        for path, stop in ((self.path, end), (self.rotated, None)):
            try:
                with _open_own(path) as fh:
                    pos = stop if stop is not None else fh.seek(0, os.SEEK_END)
                    while pos > 0 and len(data) < limit and (lines == 0 or _lines_in(data) <= lines):
                        step = min(_BLOCK, pos, limit - len(data))
                        pos -= step
                        fh.seek(pos)
                        data = fh.read(step) + data
            except OSError:
                continue
            if lines and _lines_in(data) > lines:
                break
        if lines:
            data = _last_lines(data, lines)
        return data, Cursor(end, gen)

    def read_from(self, cursor: Cursor, limit: int) -> tuple[bytes, Cursor]:
        """What was written after ``cursor`` (at most ``limit`` bytes) and the cursor after it.

        After a rotation the rest of the copy in ``output.log.1`` comes first, then the new live
        file from its start. (Two rotations between two reads lose what the first copy held.)
        """
        gen = self.generation()
        offset = cursor.offset
        if gen != cursor.generation:
            try:
                with _open_own(self.rotated) as fh:
                    fh.seek(offset)
                    data = fh.read(limit)
            except OSError:
                data = b""
            if data:
                return data, Cursor(offset + len(data), cursor.generation)
            offset = 0
        elif self.size() < offset:   # truncated by someone else
            offset = 0
        try:
            with _open_own(self.path) as fh:
                fh.seek(offset)
                data = fh.read(limit)
        except OSError:
            return b"", Cursor(offset, gen)
        return data, Cursor(offset + len(data), gen)


def _own_file(path: Path) -> os.stat_result | None:
    """``path``'s status if it is a regular file (not a link) of the agent's own user, else None."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() else None


def _open_own(path: Path):
    """Open ``path`` for reading without following a link, only if it is a regular file of the agent's own.

    :raises OSError: a link (ELOOP), another kind of file or another owner (EPERM).
    """
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise PermissionError(1, f"{path} is not a regular file of the agent's own")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


@dataclass(frozen=True, slots=True)
class Cursor:
    """A reader's place: an offset in the live file of one rotation generation."""

    offset: int
    generation: tuple[int, int] | None


def _lines_in(data: bytes) -> int:
    """Complete or partial lines in ``data`` (a trailing newline ends a line, it starts none)."""
    if not data:
        return 0
    return data.count(b"\n") + (0 if data.endswith(b"\n") else 1)


def _last_lines(data: bytes, n: int) -> bytes:
    body = data[:-1] if data.endswith(b"\n") else data
    cut = len(body)
    for _ in range(n):
        cut = body.rfind(b"\n", 0, cut)
        if cut < 0:
            return data
    return data[cut + 1:]


def _chunks(data: bytes, size: int = CHUNK_BYTES) -> list[bytes]:
    """``data`` in pieces of at most ``size``, each cut after a newline where there is one."""
    out = []
    while data:
        piece = data[:size]
        if len(data) > size:
            nl = piece.rfind(b"\n")
            if nl > 0:
                piece = piece[:nl + 1]
        out.append(piece)
        data = data[len(piece):]
    return out


Send = Callable[[agent_pb2.LogChunk], Awaitable[None]]
"""Queues one chunk for the coordinator; waits while the stream's queue is full."""


class LogService:
    """Answers LogRequests from the tasks' log files under ``state_dir/tasks``.

    :param state_dir: the agent's state directory.
    :param running: whether a task still runs here (a follower stops once it does not).
    :param clock: monotonic seconds (rate limiting).
    """

    def __init__(self, state_dir: Path, running: Callable[[str], bool], *,
                 clock: Callable[[], float] = time.monotonic, poll_s: float = _POLL_S) -> None:
        self.tasks_dir = Path(state_dir) / "tasks"
        self._running = running
        self._clock = clock
        self._poll_s = poll_s
        self._active: dict[str, asyncio.Task[None]] = {}
        self._log = get_logger("agent").bind(component="logs")

    def log(self, task_id: str) -> TaskLog:
        return TaskLog(self.tasks_dir / task_id / "output.log")

    def handle(self, req: agent_pb2.LogRequest, send: Send) -> None:
        """Start answering ``req`` (``send`` queues one chunk and resolves when there is room)."""
        if req.cancel:
            task = self._active.pop(req.request_id, None)
            if task is not None:
                task.cancel()
            return
        if not req.request_id or len(req.request_id) > 64 or req.request_id in self._active:
            self._log.warning("log_request_refused", request_id=req.request_id[:64], reason="bad request id")
            return
        self._active[req.request_id] = asyncio.create_task(self._answer(req, send))

    def cancel_all(self) -> None:
        """The stream to the coordinator ended: its requests end with it."""
        for task in self._active.values():
            task.cancel()
        self._active.clear()

    async def _answer(self, req: agent_pb2.LogRequest, send: Send) -> None:
        def chunk(**kw: Any) -> agent_pb2.LogChunk:   # LogChunk fields (data, eof, error, not_found)
            return agent_pb2.LogChunk(request_id=req.request_id, task_id=req.task_id, **kw)

        try:
            if not valid_task_id(req.task_id):
                await send(chunk(eof=True, error=f"invalid task id {req.task_id[:64]!r}"))
                return
            if req.follow and sum(1 for t in self._active.values() if not t.done()) > MAX_FOLLOWERS:
                await send(chunk(eof=True, error=f"more than {MAX_FOLLOWERS} log readers on this node; "
                                 "try again later"))
                return
            log = self.log(req.task_id)
            if not log.exists():
                await send(chunk(eof=True, not_found=True, error=f"no output log for task {req.task_id!r}"))
                return
            data, cursor = await asyncio.to_thread(log.tail, min(req.tail_lines, MAX_TAIL_LINES))
            budget = _Budget(self._clock)
            for piece in _chunks(data):
                await budget.spend(len(piece))
                await send(chunk(data=piece))
            while req.follow:
                running = self._running(req.task_id)
                data, cursor = await asyncio.to_thread(log.read_from, cursor, CHUNK_BYTES)
                if data:
                    for piece in _chunks(data):
                        await budget.spend(len(piece))
                        await send(chunk(data=piece))
                    continue
                if not running:
                    break   # read once more after it ended: nothing is left behind
                await asyncio.sleep(self._poll_s)
            await send(chunk(eof=True))
        finally:
            self._active.pop(req.request_id, None)


class _Budget:
    """At most RATE_BYTES_PER_S for one request (sleeps when over)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._start = clock()
        self._sent = 0

    async def spend(self, n: int) -> None:
        self._sent += n
        ahead = self._sent / RATE_BYTES_PER_S - (self._clock() - self._start)
        if ahead > 0:
            await asyncio.sleep(ahead)
