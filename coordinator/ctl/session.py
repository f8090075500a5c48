"""``gptrmctl run``, ``exec`` and ``attach``: interactive sessions through the coordinator (docs/interactive.md).

A session is the Admin ``Session`` call: the first message opens it (the task, the rank, exec's
command), the next ones carry standard input (and the window size on a terminal); the answers are
the output. On a terminal, gptrmctl puts the local terminal in raw mode for the session (so keys,
Ctrl-C included, go to the remote side) and restores it after; the window size follows SIGWINCH.

- ``run --pty -- CMD`` submits a task with ``pty`` set, waits until it runs, attaches with
  ``hangup_on_close`` (the task's terminal closes with this session: the task ends with its shell),
  and exits with the task's exit code.
- ``exec TASK [--rank R] [--pty] -- CMD`` runs CMD in the task's context and exits with its exit code.
- ``attach TASK`` shows a ``--pty`` task's terminal and forwards standard input to it (its end does
  not end the task); for any other task it follows its output as ``logs -f`` does.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import sys
import termios
import threading
import tty
from collections.abc import Iterator
from typing import Any

import grpc

from common.pb.gptrm.v1 import admin_pb2
from coordinator.ctl.transport import EXIT_REFUSED, CtlError, Transport

__all__ = ["SessionResult", "run_session"]

_READ_BYTES = 4096
_POLL_S = 0.2


class SessionResult:
    """How a session ended: ``exit_code`` (exec: its command's; None when the agent reported none)."""

    def __init__(self) -> None:
        self.exit_code: int | None = None
        self.exited = False
        self.node_id = ""


class _Input:
    """The requests of one session: the open message, then standard input until it ends, then nothing more
    until the session does (the call stays open for the output). Iterated anew for each try of the call."""

    def __init__(self, opened: admin_pb2.TaskSessionOpen, *, forward_stdin: bool, terminal: bool) -> None:
        self._open = opened
        self._forward = forward_stdin
        self._terminal = terminal
        self.done = threading.Event()
        self._resized = threading.Event()

    def resized(self) -> None:
        self._resized.set()

    def __iter__(self) -> Iterator[admin_pb2.TaskSessionInput]:
        yield admin_pb2.TaskSessionInput(open=self._open)
        fd = sys.stdin.fileno() if self._forward else -1
        while not self.done.is_set():
            if self._resized.is_set():
                self._resized.clear()
                rows, cols = _size()
                yield admin_pb2.TaskSessionInput(rows=rows, cols=cols)
            if fd < 0:
                self.done.wait(_POLL_S)
                continue
            ready, _, _ = select.select([fd], [], [], _POLL_S)
            if not ready:
                continue
            try:
                data = os.read(fd, _READ_BYTES)
            except OSError:
                data = b""
            if not data:
                yield admin_pb2.TaskSessionInput(eof=True)
                fd = -1
                continue
            yield admin_pb2.TaskSessionInput(data=data)


def _size() -> tuple[int, int]:
    size = shutil.get_terminal_size((80, 24))
    return size.lines, size.columns


@contextlib.contextmanager
def _raw(enabled: bool) -> Iterator[None]:
    """The local terminal in raw mode for the session (restored however the session ends)."""
    if not enabled:
        yield
        return
    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    try:
        tty.setraw(fd)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def run_session(t: Transport, opened: admin_pb2.TaskSessionOpen, *, forward_stdin: bool = True) -> SessionResult:
    """Run one session to its end: standard input to it, its output to standard output (and standard error);
    on a terminal, in raw mode with the window size sent along.

    :raises CtlError: the coordinator refused the session, or it broke (exit code 1)."""
    terminal = forward_stdin and sys.stdin.isatty() and (opened.pty or not opened.argv)
    if terminal:
        opened.rows, opened.cols = _size()
    requests = _Input(opened, forward_stdin=forward_stdin, terminal=terminal)
    result = SessionResult()
    previous: Any = None
    if terminal:
        previous = signal.signal(signal.SIGWINCH, lambda *_: requests.resized())
    out, err = sys.stdout.buffer, sys.stderr.buffer
    try:
        with _raw(terminal):
            stream = t.stream("Session", requests, leader_only=True)
            try:
                for msg in stream:
                    if msg.node_id:
                        result.node_id = msg.node_id
                    if msg.data:
                        target = err if msg.stderr else out
                        target.write(msg.data)
                        target.flush()
                    if msg.exited:
                        result.exited = True
                        result.exit_code = msg.exit_code
            except grpc.RpcError as e:
                raise CtlError(e.details() or e.code().name, EXIT_REFUSED) from None
            finally:
                requests.done.set()
    finally:
        if terminal:
            signal.signal(signal.SIGWINCH, previous)
    return result
