"""The task life cycle: the one table of legal state changes (pure; no etcd).

Example::

    check_transition("t-1", TaskState.RUNNING, TaskState.PAUSED)    # fine
    check_transition("t-1", TaskState.RUNNING, TaskState.PENDING)
    # IllegalTransition: task t-1: RUNNING → PENDING is not allowed (from RUNNING: SUCCEEDED, ...)
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from common.errors import IllegalTransition
from common.types import TaskState

__all__ = ["LEGAL_TRANSITIONS", "Conflict", "allowed_from", "check_transition", "is_legal"]

_S = TaskState
# Cancel is allowed from every state outside TERMINAL_STATES; FAILED → PENDING is the
# restart policy re-queueing a task; PREEMPTED → PENDING puts a preempted task back in line;
# TIMEOUT (a running task stopped at its time limit) is final, like CANCELLED.
LEGAL_TRANSITIONS: Mapping[TaskState, frozenset[TaskState]] = MappingProxyType(
    {
        _S.PENDING: frozenset({_S.SCHEDULED, _S.CANCELLED}),
        _S.SCHEDULED: frozenset({_S.STARTING, _S.FAILED, _S.PREEMPTED, _S.CANCELLED}),
        _S.STARTING: frozenset({_S.RUNNING, _S.FAILED, _S.PREEMPTED, _S.CANCELLED, _S.TIMEOUT}),
        _S.RUNNING: frozenset({_S.SUCCEEDED, _S.FAILED, _S.PAUSED, _S.PREEMPTED, _S.CANCELLED, _S.TIMEOUT}),
        _S.PAUSED: frozenset({_S.RUNNING, _S.FAILED, _S.PREEMPTED, _S.CANCELLED, _S.TIMEOUT}),
        _S.PREEMPTED: frozenset({_S.PENDING, _S.CANCELLED}),
        _S.FAILED: frozenset({_S.PENDING}),
        _S.SUCCEEDED: frozenset(),
        _S.CANCELLED: frozenset(),
        _S.TIMEOUT: frozenset(),
    }
)
"""State → the states it may change to."""


class Conflict(IllegalTransition):
    """A compare-on-revision lost a race: the task (or its allocation) changed since it was read."""


def allowed_from(state: TaskState) -> frozenset[TaskState]:
    """The states ``state`` may change to (empty for SUCCEEDED, CANCELLED and TIMEOUT)."""
    return LEGAL_TRANSITIONS.get(TaskState(state), frozenset())


def is_legal(src: TaskState, dst: TaskState) -> bool:
    """True when the state machine allows ``src → dst``."""
    return TaskState(dst) in allowed_from(src)


def check_transition(task_id: str, src: TaskState, dst: TaskState) -> None:
    """Raise unless ``src → dst`` is legal.

    :raises IllegalTransition: ``task t-1: RUNNING → PENDING is not allowed (from RUNNING: ...)``.
    """
    src, dst = TaskState(src), TaskState(dst)
    if is_legal(src, dst):
        return
    allowed = ", ".join(s.name for s in sorted(allowed_from(src))) or "nothing, it is final"
    raise IllegalTransition(f"task {task_id}: {src.name} → {dst.name} is not allowed (from {src.name}: {allowed})")
