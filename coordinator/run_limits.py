"""Run-time limits of tasks, the pure parts shared by the leader's duties (docs/limits-and-reservations.md).

A task's time limit (``spec.time_limit_s``) and protected run time (``spec.min_runtime_s``) count from the
moment its current run started (:func:`run_started_s`). A task that reached its time limit is marked
``timed_out`` and stopped; however it ends after that, it ends TIMEOUT (:func:`end_of`) unless an admin
cancelled it. No preemption, queue reclaim or elastic shrink picks a task inside its protected run time
(:func:`protected`).
"""

from __future__ import annotations

from common.pb.gptrm.v1 import types_pb2
from common.types import TERMINAL_STATES, TaskState

__all__ = ["MAX_TIME_LIMIT_S", "end_of", "fmt_s", "protected", "protected_until_s", "run_started_s", "stopping"]

MAX_TIME_LIMIT_S = 365 * 86400.0
"""The longest time limit, protected run time or queue default a spec or queue may give: a year."""


def fmt_s(seconds: float) -> str:
    """``5400`` → ``1h30m``, ``3`` → ``3s`` (how limits read in reasons and errors)."""
    s = round(seconds)
    out = "".join(f"{n}{u}" for n, u in ((s // 86400, "d"), (s % 86400 // 3600, "h"), (s % 3600 // 60, "m"),
                                         (s % 60, "s")) if n)
    return out or f"{seconds:g}s"


def run_started_s(task: types_pb2.Task) -> float | None:
    """When the task's current run started: its first RUNNING since it was last placed (a resume after a pause
    does not restart the clock); None when it has not run since."""
    started = None
    for h in reversed(task.history):
        if h.state == TaskState.RUNNING:
            started = h.time_unix_s
        elif h.state in (TaskState.SCHEDULED, TaskState.PENDING):
            break
    return started


def protected_until_s(task: types_pb2.Task) -> float:
    """When the task's protected run time (``spec.min_runtime_s`` from the start of its run) ends: 0 without one,
    infinity while its run has not started (nothing to take from it yet)."""
    floor = task.spec.min_runtime_s
    if not floor:
        return 0.0
    started = run_started_s(task)
    return float("inf") if started is None else started + floor


def protected(task: types_pb2.Task, now: float) -> bool:
    """Whether the task is inside its protected run time: no preemption, queue reclaim or elastic shrink may
    pick it."""
    return now < protected_until_s(task)


def stopping(task: types_pb2.Task) -> bool:
    """Whether the task is being stopped for good (an admin cancelled it, or it reached its time limit): a part
    that is gone counts as stopped, never as a failure."""
    return task.cancel_requested or task.timed_out


def end_of(task: types_pb2.Task, state: TaskState, reason: str) -> tuple[TaskState, str]:
    """The final state a task that ended in ``state`` is recorded in: TIMEOUT once it reached its time limit
    (whatever its processes did on the way out), unless an admin cancelled it."""
    if task.timed_out and not task.cancel_requested and state in TERMINAL_STATES:
        why = f"time limit of {fmt_s(task.spec.time_limit_s)} reached"
        return TaskState.TIMEOUT, why + (f" (it ended: {reason})" if reason and state != TaskState.CANCELLED else "")
    return state, reason
