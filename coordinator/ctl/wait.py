"""``gptrmctl submit --wait``: follow a task to its final state and exit with its exit code.

Progress goes to stderr, so ``-o json`` still prints exactly one document on stdout (the final
task). On a terminal one line is rewritten in place (``\\r``); otherwise a line is printed each
time the state or the reason changes.
"""

from __future__ import annotations

import io
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, BinaryIO, TextIO

import grpc

from common.pb.gptrm.v1 import admin_pb2
from coordinator.ctl import human, render
from coordinator.ctl.transport import Transport

__all__ = ["FINAL_STATES", "OutputFollower", "exit_code_of", "wait_for_task"]

FINAL_STATES = frozenset({"succeeded", "failed", "cancelled", "timeout"})
EXIT_INTERRUPTED = 130
"""Ctrl-C while waiting: the task is left as it is, gptrmctl stops following it."""


def exit_code_of(task: dict[str, Any]) -> int:
    """The process exit status ``submit --wait`` ends with for a finished task.

    The task's own exit code (0..255); one killed by signal N (reported as -N) gives 128 + N,
    as a shell does; a task that ended without an exit code (cancelled before it started) gives 1, and so does
    one stopped at its time limit that exited 0.
    """
    code = task["exit_code"]
    if task["state"] == "timeout" and not code:
        return 1   # stopped at its time limit: never a success, even when it exited 0 on its checkpoint signal
    if code is None:
        return 0 if task["state"] == "succeeded" else 1
    if code < 0:
        return min(255, 128 - code)
    return code & 0xFF if code > 255 else code


def wait_for_task(t: Transport, task_id: str, *, interval_s: float = 0.5, err: TextIO | None = None,
                  now: Callable[[], float] = time.monotonic,
                  sleep: Callable[[float], None] = time.sleep,
                  on_state: Callable[[dict[str, Any]], object] | None = None,
                  until: tuple[str, ...] = ()) -> dict[str, Any]:
    """Poll the task until it reaches a final state, reporting progress on ``err`` (and each document read to
    ``on_state``); returns its document. ``until``: states that end the wait too (``running``).

    :raises KeyboardInterrupt: passed on, after ending the progress line.
    """
    err = err or sys.stderr
    tty = err.isatty()
    started = now()
    last = ("", "")
    try:
        while True:
            d = render.task_dict(t.call("GetTask", admin_pb2.GetTaskRequest(task_id=task_id)))
            if on_state is not None:
                on_state(d)
            reason = human.lead_with_cause(d["reason"])
            line = f"task {d['task_id']}: {d['state']} after {human.fmt_duration(now() - started)}"
            if reason and d["state"] not in ("running", "succeeded"):
                line += f" — {reason}"
            line = human.escape(line)
            if tty:
                err.write("\r\x1b[K" + human.truncate(line, 150))
                err.flush()
            elif (d["state"], d["reason"]) != last:
                print(line, file=err, flush=True)
            last = (d["state"], d["reason"])
            if d["state"] in FINAL_STATES or d["state"] in until:
                return d
            sleep(interval_s)
    finally:
        if tty:
            err.write("\n")
            err.flush()


class OutputFollower:
    """``submit --wait``'s live output: every rank's output as its agent logs it, through ``TaskLogs`` with
    follow, each line prefixed with its rank (``0: ``, ``1: ``, as ``srun -l``), one thread per rank.

    :param out: where the lines go (stdout's bytes).
    """

    def __init__(self, t: Transport, task_id: str, out: BinaryIO) -> None:
        self._t, self._task_id, self._out = t, task_id, out
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._streams: list[Any] = []
        self._stopped = threading.Event()

    def start(self, task: dict[str, Any]) -> bool:
        """Start following once ``task`` (its document) runs or ran on nodes; False while it has none yet."""
        ranks = len(task["parts"]) or len(task["allocation"])
        if self._threads or not ranks or task["state"] in ("pending", "scheduled"):
            return bool(self._threads)
        for rank in range(ranks):
            th = threading.Thread(target=self._follow, args=(rank,), name=f"gptrmctl-output-{rank}", daemon=True)
            th.start()
            self._threads.append(th)
        return True

    def _follow(self, rank: int) -> None:
        pending = b""
        prefix = f"{rank}: ".encode()
        try:
            stream = self._t.stream("TaskLogs", admin_pb2.TaskLogsRequest(task_id=self._task_id, follow=True,
                                                                           rank=rank), leader_only=True)
            with self._lock:
                self._streams.append(stream)
            for chunk in stream:
                lines = (pending + chunk.data).split(b"\n")
                pending = lines.pop()
                if lines:
                    self._write(b"".join(prefix + line + b"\n" for line in lines))
        except (grpc.RpcError, Exception) as e:   # the output is a convenience: the exit code still comes
            if not self._stopped.is_set():
                print(human.escape(f"rank {rank}: output not followed: {_detail(e)}"), file=sys.stderr)
        if pending:
            self._write(prefix + pending + b"\n")

    def _write(self, data: bytes) -> None:
        with self._lock:
            self._out.write(data)
            self._out.flush()

    def finish(self, timeout_s: float = 10.0) -> None:
        """The task ended: let each rank's stream deliver what its log still holds, then stop."""
        deadline = time.monotonic() + timeout_s
        for th in self._threads:
            th.join(max(0.0, deadline - time.monotonic()))
        self._stopped.set()
        with self._lock:
            for stream in self._streams:
                stream.cancel()


def _detail(e: BaseException) -> str:
    if isinstance(e, grpc.RpcError):
        return e.details() or e.code().name
    return str(e) or type(e).__name__


class _Lines(io.TextIOBase):
    """stderr as a line printer: :func:`wait_for_task` then prints one line per change rather than rewrite
    one line in place, which the task's output on the same terminal would break up."""

    def __init__(self, err: TextIO) -> None:
        self._err = err

    def isatty(self) -> bool:
        return False

    def write(self, text: str) -> int:
        return self._err.write(text)

    def flush(self) -> None:
        self._err.flush()


def progress_lines(err: TextIO | None = None) -> TextIO:
    """Where :func:`wait_for_task` reports while the task's own output is shown: ``err`` (stderr), a line
    per change."""
    return _Lines(err or sys.stderr)  # type: ignore[return-value]
