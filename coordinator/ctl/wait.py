"""``gptrmctl submit --wait``: follow a task to its final state and exit with its exit code.

Progress goes to stderr, so ``-o json`` still prints exactly one document on stdout (the final
task). On a terminal one line is rewritten in place (``\\r``); otherwise a line is printed each
time the state or the reason changes.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from common.pb.gptrm.v1 import admin_pb2
from coordinator.ctl import human, render
from coordinator.ctl.transport import Transport

__all__ = ["FINAL_STATES", "exit_code_of", "wait_for_task"]

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
                  sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
    """Poll the task until it reaches a final state, reporting progress on ``err``; returns its document.

    :raises KeyboardInterrupt: passed on, after ending the progress line.
    """
    err = err or sys.stderr
    tty = err.isatty()
    started = now()
    last = ("", "")
    try:
        while True:
            d = render.task_dict(t.call("GetTask", admin_pb2.GetTaskRequest(task_id=task_id)))
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
            if d["state"] in FINAL_STATES:
                return d
            sleep(interval_s)
    finally:
        if tty:
            err.write("\n")
            err.flush()
