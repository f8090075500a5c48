"""The leader's workflow rules: which pending tasks a cycle may place (``docs/workflows.md``).

Before a cycle ranks its pending tasks, the gate holds back:

- a task whose start time (``spec.begin_unix_s``) is ahead: "begins at 2026-06-01T18:00:00Z";
- a task waiting for its dependencies (``spec.after``): "waiting for t-... to succeed". A dependency that can
  no longer be met (``ok`` on a task that failed, ``notok`` on one that succeeded) ends the task CANCELLED,
  "dependency t-... failed: never satisfied" — or, with ``spec.keep_unmet``, leaves it pending with that reason;
- array elements beyond their array's ``%MAX``: of one array, never more than ``max_running`` elements are
  placed or running at once; the count is taken from the elements' own states every cycle, so it holds across
  leader changes. The lowest indices go first.

The check is cheap: each pending task looks up the tasks it names (a dict lookup each); an array target is
summarised once per cycle from the leader state's index of its elements, never by a scan of every task.

A dependency's end is final once the task ended and its restart policy will not requeue it (``will_restart``):
a task that failed and is about to be restarted is still awaited.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from common.pb.gptrm.v1 import types_pb2
from common.types import TERMINAL_STATES, TaskState

__all__ = ["Gated", "Outcome", "WorkflowGate", "begins_text"]

_WAIT_FOR = {types_pb2.DEPENDENCY_KIND_OK: "succeed", types_pb2.DEPENDENCY_KIND_NOTOK: "fail",
             types_pb2.DEPENDENCY_KIND_ANY: "end"}


@dataclass(slots=True)
class Outcome:
    """How a target (one task, or every element of an array) stands: counts of its tasks by end."""

    ok: int = 0          # succeeded, for good
    notok: int = 0       # failed or cancelled, for good
    open: int = 0        # not ended (or ended but about to be restarted)
    bad: str = ""        # the first that did not succeed, in words ("failed", "element 3 cancelled")
    good: str = ""       # the first that succeeded, in words


@dataclass(slots=True)
class Gated:
    """One cycle's verdict on its pending tasks."""

    ready: list[types_pb2.Task] = field(default_factory=list)            # may be placed now
    unmet: list[tuple[types_pb2.Task, str]] = field(default_factory=list)  # to end CANCELLED, with the reason
    held: dict[str, str] = field(default_factory=dict)                     # task id → why it waits


def begins_text(begin_unix_s: float) -> str:
    """The pending reason of a task whose start time is ahead."""
    return "begins at " + datetime.fromtimestamp(begin_unix_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class WorkflowGate:
    """Start times, dependencies and array limits, applied to each cycle's pending tasks.

    Example::

        gate = WorkflowGate(tasks.find, tasks.array_elements, will_restart=restarts.allows)
        gated = gate.sort(pending, time.time())   # gated.ready to rank; gated.unmet to end

    :param find: a task by id (None: unknown).
    :param elements: an array's elements by index (empty: unknown).
    :param will_restart: whether an ended task is about to be requeued by its restart policy.
    """

    def __init__(self, find: Callable[[str], types_pb2.Task | None],
                 elements: Callable[[str], Sequence[types_pb2.Task]],
                 will_restart: Callable[[types_pb2.Task], bool] = lambda task: False) -> None:
        self._find, self._elements, self._will_restart = find, elements, will_restart

    def sort(self, pending: Iterable[types_pb2.Task], now: float | None = None) -> Gated:
        """Which of ``pending`` may be placed now; the others with why they wait, or why they end."""
        now = time.time() if now is None else now
        out = Gated()
        arrays: dict[str, Outcome] = {}      # array targets summarised this cycle
        capped: dict[str, list[types_pb2.Task]] = {}
        for task in pending:
            spec = task.spec
            if spec.begin_unix_s > now:
                out.held[task.id] = begins_text(spec.begin_unix_s)
                continue
            verdict = self._dependencies(task, arrays) if spec.after else None
            if verdict is not None:
                unmet, reason = verdict
                if unmet and not spec.keep_unmet:
                    out.unmet.append((task, reason))
                else:
                    out.held[task.id] = reason
                continue
            if task.array_id and spec.array.max_running:
                capped.setdefault(task.array_id, []).append(task)
                continue
            out.ready.append(task)
        for array_id, waiting in capped.items():
            most = waiting[0].spec.array.max_running
            active = sum(1 for t in self._elements(array_id)
                         if t.state != TaskState.PENDING and t.state not in TERMINAL_STATES)
            waiting.sort(key=lambda t: t.array_index)
            room = max(0, most - active)
            out.ready.extend(waiting[:room])
            for task in waiting[room:]:
                out.held[task.id] = f"array {array_id}: {most} elements placed or running already (%{most})"
        return out

    def outcome(self, target: str, arrays: dict[str, Outcome] | None = None) -> Outcome | None:
        """How ``target`` (a task or an array id) stands; None when neither is known."""
        task = self._find(target)
        if task is not None:
            return self._tally(Outcome(), task, "")
        if arrays is not None and target in arrays:
            return arrays[target]
        elements = self._elements(target)
        if not elements:
            return None
        summary = Outcome()
        for element in elements:
            self._tally(summary, element, f"element {element.array_index} ")
        if arrays is not None:
            arrays[target] = summary
        return summary

    def _tally(self, summary: Outcome, task: types_pb2.Task, what: str) -> Outcome:
        if task.state not in TERMINAL_STATES or self._will_restart(task):
            summary.open += 1
        elif task.state == TaskState.SUCCEEDED:
            summary.ok += 1
            summary.good = summary.good or f"{what}succeeded"
        else:
            summary.notok += 1
            summary.bad = summary.bad or f"{what}{TaskState(task.state).label}"
        return summary

    def _dependencies(self, task: types_pb2.Task, arrays: dict[str, Outcome]) -> tuple[bool, str] | None:
        """None when every dependency is satisfied; else (whether one can never be, the reason)."""
        waiting: str | None = None
        for dep in task.spec.after:
            for target in dep.ids:
                o = self.outcome(target, arrays)
                if o is None:
                    return True, f"dependency {target} is no longer known: never satisfied"
                if dep.kind == types_pb2.DEPENDENCY_KIND_OK:
                    if o.notok:
                        return True, f"dependency {target} {o.bad}: never satisfied"
                    done = not o.open
                elif dep.kind == types_pb2.DEPENDENCY_KIND_NOTOK:
                    if not o.open and not o.notok:
                        return True, f"dependency {target} {o.good}: never satisfied"
                    done = not o.open
                else:
                    done = not o.open
                if not done and waiting is None:
                    waiting = f"waiting for {target} to {_WAIT_FOR.get(dep.kind, 'end')}"
        return None if waiting is None else (False, waiting)
