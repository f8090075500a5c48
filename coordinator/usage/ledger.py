"""The usage ledger's arithmetic: what tasks used between two times, per hour, queue, user and GPU model.

Nothing here reads a clock or etcd: a pass is :func:`account` over the task table, the window
``[since, until)`` and the marks of the previous pass, and returns the usage to add to each hour's
rows and the marks of the next pass.

- **Time held** comes from each task's state history (the times etcd stored with every change): a
  task holds its allocation while it is scheduled, starting, running or paused. GPU-seconds are the
  allocation's GPUs (a shared GPU counts its share) × the seconds held, CPU core-seconds the
  allocation's cores × the seconds held, split at hour boundaries exactly. Two passes over adjoining
  windows add up to one pass over both, so a pass can be repeated from the stored
  ``accounted_until`` after a leader change with nothing counted twice.
- **Energy** is cumulative per task (:data:`EnergyOf`: what it drew so far). A pass adds what it
  drew since the task's mark, spread over the hours it held its allocation in the window, and
  moves the mark; a finished task's mark is dropped once its end is behind the window.
- **Tasks** counts each task once, in the hour it ended.
- **GPU models**: time held goes to the model of the GPUs that held it. A task back in the queue (preempted,
  resized, restarted) has no allocation any more; the time it held before that goes to the allocation it
  gave up (:data:`ReleasedOf`), the time since its latest placement to its allocation now.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from common.pb.gptrm.v1 import types_pb2
from common.types import TERMINAL_STATES, TaskState
from coordinator.domain import ended_at

__all__ = [
    "HOLDING_STATES",
    "HOUR_S",
    "LABEL_CHARS",
    "OTHER",
    "Accrual",
    "EnergyOf",
    "ModelOf",
    "ReleasedOf",
    "RowKey",
    "Usage",
    "account",
    "add_rows",
    "held_intervals",
    "hour_of",
    "split_hours",
]

HOUR_S = 3600
"""Seconds per bucket."""

HOLDING_STATES = frozenset({TaskState.SCHEDULED, TaskState.STARTING, TaskState.RUNNING, TaskState.PAUSED})
"""States in which a task holds its allocation."""

LABEL_CHARS = 128
"""A row's queue, user and GPU model are cut to this many characters (so an hour's rows stay small)."""

OTHER = "other"
"""The queue and user of the row that takes what no longer fits a bucket's row limit."""

ModelOf = Callable[[str, list[int]], str]
"""(node id, GPU indices) → the model of those GPUs (``""`` for none, ``"unknown"`` when not known)."""

EnergyOf = Callable[[types_pb2.Task], float]
"""A task → joules it drew so far (all its runs), as far as is known now."""

ReleasedOf = Callable[[str], Sequence[types_pb2.NodeAllocation]]
"""A task id → the allocation the task last gave up when it went back to the queue (empty: not known)."""


def _none_released(_task_id: str) -> Sequence[types_pb2.NodeAllocation]:
    return ()


@dataclass(frozen=True, slots=True, order=True)
class RowKey:
    """One row of an hour: the task's queue, its submitter and the GPU model."""

    queue: str
    user: str
    gpu_model: str


@dataclass(slots=True)
class Usage:
    """What the tasks of one row used (all non-negative)."""

    gpu_s: float = 0.0
    cpu_core_s: float = 0.0
    energy_j: float = 0.0
    tasks: int = 0

    def add(self, other: Usage) -> None:
        self.gpu_s += other.gpu_s
        self.cpu_core_s += other.cpu_core_s
        self.energy_j += other.energy_j
        self.tasks += other.tasks


Rows = dict[RowKey, Usage]
"""One hour's rows."""


@dataclass
class Accrual:
    """The result of one pass: usage per hour (start of the hour → rows) and the next pass's marks."""

    hours: dict[int, Rows] = field(default_factory=dict)
    marks: dict[str, float] = field(default_factory=dict)

    def row(self, hour: int, key: RowKey) -> Usage:
        return self.hours.setdefault(hour, {}).setdefault(key, Usage())


def hour_of(t: float) -> int:
    """The start of the hour holding ``t`` (unix seconds)."""
    return math.floor(t / HOUR_S) * HOUR_S


def split_hours(start: float, end: float) -> list[tuple[int, float]]:
    """``[start, end)`` cut at hour boundaries: (hour, seconds in it) for each hour it touches."""
    out: list[tuple[int, float]] = []
    t = start
    while t < end:
        hour = hour_of(t)
        stop = min(end, hour + HOUR_S)
        out.append((hour, stop - t))
        t = stop
    return out


def held_intervals(task: types_pb2.Task, since: float, until: float) -> list[tuple[float, float]]:
    """The parts of ``[since, until)`` in which ``task`` held its allocation, from its state history."""
    history = task.history
    out: list[tuple[float, float]] = []
    for i, change in enumerate(history):
        if change.state not in HOLDING_STATES:
            continue
        start = change.time_unix_s
        end = history[i + 1].time_unix_s if i + 1 < len(history) else until
        start, end = max(start, since), min(end, until)
        if math.isfinite(start) and math.isfinite(end) and end > start:
            out.append((start, end))
    return out


def _ended_at(task: types_pb2.Task) -> float | None:
    return ended_at(task) if task.state in TERMINAL_STATES else None


def _shares(nodes: Sequence[types_pb2.NodeAllocation], demand: types_pb2.ResourceVector,
            model_of: ModelOf) -> list[tuple[str, float, float]]:
    """(GPU model, GPUs, CPU cores) of each node of an allocation (the demand's, model unknown, when empty)."""
    out = []
    for na in nodes:
        share = na.gpu_share if 0 < na.gpu_share <= 1 else 1.0
        gpus = len(na.gpu_indices) * share
        cores = na.demand.cpu_cores if math.isfinite(na.demand.cpu_cores) and na.demand.cpu_cores > 0 else 0.0
        out.append((model_of(na.node_id, list(na.gpu_indices))[:LABEL_CHARS] if na.gpu_indices else "", gpus, cores))
    if not out:
        gpus = demand.gpus if math.isfinite(demand.gpus) and demand.gpus > 0 else 0.0
        cores = demand.cpu_cores if math.isfinite(demand.cpu_cores) and demand.cpu_cores > 0 else 0.0
        out.append(("unknown" if gpus else "", gpus, cores))
    return out


def _requeued_at(task: types_pb2.Task) -> float:
    """When the task last went back to the queue after holding an allocation (-inf: never)."""
    for i in range(len(task.history) - 1, 0, -1):
        if task.history[i].state == TaskState.PENDING and task.history[i - 1].state != TaskState.PENDING:
            return task.history[i].time_unix_s
    return -math.inf


def account(tasks: Iterable[types_pb2.Task], since: float, until: float, marks: Mapping[str, float],
            model_of: ModelOf, energy_of: EnergyOf, released: ReleasedOf = _none_released, *,
            into: Accrual | None = None) -> Accrual:
    """What ``tasks`` used in ``[since, until)``.

    Each task is accounted on its own, so a pass may account its tasks part by part into one accrual.

    :param marks: task id → joules of that task already accounted (the previous pass's ``marks``).
    :param model_of: the GPU model of a node's GPUs.
    :param energy_of: the joules a task drew so far.
    :param released: the allocation a task gave up when it last went back to the queue.
    :param into: the accrual to add to (None: a new one).
    :returns: usage per hour and row, and the marks for the pass that starts at ``until`` (``into`` when given).
    """
    acc = Accrual() if into is None else into
    for task in tasks:
        ended = _ended_at(task)
        if ended is not None and ended < since and task.id not in marks:
            continue   # accounted by an earlier pass
        key = (task.queue[:LABEL_CHARS], task.submitted_by[:LABEL_CHARS])
        shares = _shares(task.allocation.nodes, task.demand, model_of)
        gave_up = released(task.id)
        earlier = _shares(gave_up, task.demand, model_of) if gave_up else shares
        if not task.allocation.nodes:
            shares = earlier
        requeued = _requeued_at(task)
        held = held_intervals(task, since, until)
        # Seconds held per hour, then per row: the weights energy is spread by.
        weights: dict[tuple[int, str], float] = {}
        for start, end in held:
            for hour, seconds in split_hours(start, end):
                for model, gpus, cores in earlier if start < requeued else shares:
                    usage = acc.row(hour, RowKey(*key, model))
                    usage.gpu_s += gpus * seconds
                    usage.cpu_core_s += cores * seconds
                    weight = seconds * (gpus or cores or 1.0)
                    weights[(hour, model)] = weights.get((hour, model), 0.0) + weight
        if ended is not None and (since <= ended < until or ended < since):
            # (Before the window: an end that landed in the table after the pass that covered it, which saw the
            # task unfinished and kept its mark; counted now, once.)
            acc.row(hour_of(ended), RowKey(*key, shares[0][0])).tasks += 1
        energy = energy_of(task)
        mark = marks.get(task.id, 0.0)
        if math.isfinite(energy) and energy > mark:
            delta = energy - mark
            total = sum(weights.values())
            if total > 0:
                for (hour, model), weight in weights.items():
                    acc.row(hour, RowKey(*key, model)).energy_j += delta * weight / total
            else:   # drawn outside any time held in the window (reported late): the window's last hour
                last = min(until, ended) if ended is not None else until
                acc.row(hour_of(max(since, last - 1e-6)), RowKey(*key, shares[0][0])).energy_j += delta
            mark = energy
        if (ended is None and (mark > 0 or task.state in HOLDING_STATES)) or (ended is not None and ended >= until):
            # Unfinished, or its end is not behind the window yet: the next pass needs its mark (also to know
            # that it has not counted the task's end yet).
            acc.marks[task.id] = mark
    return acc


def add_rows(rows: Rows, more: Rows, *, max_rows: int) -> None:
    """Add ``more`` into ``rows``; a new row beyond ``max_rows`` goes into its model's ``other`` row."""
    for key, usage in more.items():
        if key not in rows and len(rows) >= max_rows:
            key = RowKey(OTHER, OTHER, key.gpu_model)
            if key not in rows and len(rows) >= max_rows + 64:   # a few spare rows for the models' others
                key = RowKey(OTHER, OTHER, OTHER)
        rows.setdefault(key, Usage()).add(usage)
