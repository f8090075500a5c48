"""Time limits on the leader (docs/limits-and-reservations.md).

A task's **time limit** (``spec.time_limit_s``; its queue's default filled in at submit,
``coordinator/queues/limits.py``) counts from the moment its current run started
(``coordinator.run_limits.run_started_s``). When it is reached, :class:`TimeLimits` (a leader duty) first records the
intent durably (``timed_out``, a fenced write, so that a new leader ends it the same way), then stops the task
like a preemption: the agent sends the checkpoint signal, waits the task's grace, then stops it. However
the task ends after that it ends ``TIMEOUT`` (``coordinator.run_limits.end_of``), a final state the restart policy never
touches; an admin's cancel still wins (it ends CANCELLED).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from common.errors import GptrmError
from common.logging import get_logger
from common.pb.gptrm.v1 import types_pb2
from common.types import TERMINAL_STATES, TaskState
from coordinator.events import EventBus
from coordinator.profiler.qos_spec import DEFAULT_CHECKPOINT_SIGNAL
from coordinator.run_limits import fmt_s, run_started_s
from coordinator.supervisor import Beat, no_beat

if TYPE_CHECKING:   # types only: the dispatch package imports this module
    from coordinator.dispatch.dispatcher import Dispatcher
    from coordinator.sync.leadership import Leadership
    from coordinator.tasks import TaskTable

__all__ = ["TimeLimits"]

_DEFAULT_GRACE_S = 10.0
_RESEND_SLACK_S = 30.0   # a stop not answered within twice the grace plus this is sent again
_LIMITED = (TaskState.RUNNING, TaskState.PAUSED)


class TimeLimits:
    """The leader duty that stops tasks at their time limit.

    :param tasks: the task table (fenced writes).
    :param leadership: nothing is done on a standby.
    :param dispatcher: stop decisions carrying the checkpoint signal.
    :param events: the cluster event log.
    :param now: the clock (unix seconds).
    """

    def __init__(self, tasks: TaskTable, leadership: Leadership, dispatcher: Dispatcher, events: EventBus,
                 now: Callable[[], float] = time.time) -> None:
        self._tasks, self._leadership, self._dispatcher, self._events = tasks, leadership, dispatcher, events
        self._now = now
        self._sent: dict[str, float] = {}   # task id → when this leader last sent its stop
        self._log = get_logger("qos")

    def due(self) -> list[types_pb2.Task]:
        """Running or paused tasks past their time limit (those already stopping included)."""
        now = self._now()
        out = []
        for t in self._tasks.live():   # running and paused tasks are live: the finished ones retained are not walked
            if not t.spec.time_limit_s or t.state not in _LIMITED or t.cancel_requested:
                continue
            started = run_started_s(t)
            if started is not None and now - started >= t.spec.time_limit_s:
                out.append(t)
        return out

    async def check(self) -> list[str]:
        """Stop every task past its time limit (and stop again one whose stop went unanswered); the ids stopped."""
        now = self._now()
        stopped = []
        for task in self.due():
            grace = task.spec.stop_grace_s or _DEFAULT_GRACE_S
            sent = self._sent.get(task.id)
            if sent is not None and now - sent < 2 * grace + _RESEND_SLACK_S:
                continue
            try:
                if not task.timed_out:
                    task = await self._tasks.update(task.id, timed_out=True)
            except GptrmError as e:   # it changed meanwhile: looked at again next pass
                self._log.info("time_limit_deferred", task_id=task.id, reason=str(e))
                continue
            limit = fmt_s(task.spec.time_limit_s)
            reason = f"time limit of {limit} reached"
            signal = task.spec.checkpoint_signal or DEFAULT_CHECKPOINT_SIGNAL
            self._dispatcher.stop(task, reason, checkpoint_signal=signal)
            self._sent[task.id] = now
            self._tasks.note_reason(task.id, f"{reason}: {signal} sent, stopped after {fmt_s(grace)} grace")
            if sent is None:
                self._log.info("task_time_limit_reached", task_id=task.id, time_limit_s=task.spec.time_limit_s,
                               signal=signal, grace_s=grace)
                self._events.publish("task_state", f"task {task.id} reached its time limit of {limit}: {signal}, "
                                     f"then stopped after {fmt_s(grace)}", task_id=task.id, reason=reason)
            stopped.append(task.id)
        for tid in [tid for tid in self._sent if (t := self._tasks.find(tid)) is None or t.state in TERMINAL_STATES]:
            del self._sent[tid]
        return stopped

    async def run(self, beat: Beat = no_beat, interval_s: float = 1.0) -> None:
        """Check every ``interval_s`` while leading."""
        while True:
            await asyncio.sleep(interval_s)
            if self._leadership.leading and not self._leadership.stale:
                await self.check()
            beat()
