"""Energy each task drew, from its agents' shares, until the task ends.

Part of the Resource Monitor. Every telemetry sample lists, per task on the node, the task's
running energy total on that agent (``HostSample.tasks[].energy_share_j``: its share of the
GPUs' and CPU's power, integrated by the agent since the task appeared there). The store keeps
the last total per (task, node) and adds up the increases, so a task on several nodes sums
their shares, and an agent that restarted (its total starts again from zero) adds its new total
rather than losing or double-counting it.

When a task ends, :meth:`TaskEnergy.finish` hands its energy over (stored on the task) and adds
it to a per-kind total exported as ``gptrm_task_energy_joules_total{kind}``: task ids never
become labels. Telemetry is untrusted: NaN, infinite and negative totals are ignored, task ids
are bounded, and so is the number of tasks tracked (the least recently updated go first).
"""

from __future__ import annotations

import math
from collections import OrderedDict

from common.pb.gptrm.v1 import types_pb2
from common.types import TaskKind

__all__ = ["MAX_TASKS", "TaskEnergy"]

MAX_TASKS = 16384
"""Running tasks whose energy is tracked at once."""
_MAX_ID = 128


class TaskEnergy:
    """Per-task energy accumulated from the agents' running shares.

    Example::

        energy = TaskEnergy()
        energy.observe("n1", sample)              # each sample's host.tasks[].energy_share_j
        joules = energy.finish("t-1", TaskKind.TRAINING)

    :param max_tasks: tasks tracked at once.
    """

    def __init__(self, max_tasks: int = MAX_TASKS) -> None:
        self._max = max_tasks
        self._total: OrderedDict[str, float] = OrderedDict()      # task id → joules so far
        self._last: dict[str, dict[str, float]] = {}               # task id → node id → agent's last total
        self.by_kind: dict[str, float] = {kind.label: 0.0 for kind in TaskKind}

    def observe(self, node_id: str, sample: types_pb2.TelemetrySample) -> None:
        """Add the increases of every task's running total in one sample of ``node_id``."""
        for usage in sample.host.tasks:
            task_id, value = usage.task_id, usage.energy_share_j
            if not task_id or len(task_id) > _MAX_ID or not math.isfinite(value) or value < 0:
                continue
            nodes = self._last.setdefault(task_id, {})
            last = nodes.get(node_id)
            delta = value if last is None or value < last else value - last   # smaller: the agent restarted
            nodes[node_id] = value
            self._total[task_id] = self._total.get(task_id, 0.0) + delta
            self._total.move_to_end(task_id)
        while len(self._total) > self._max:
            evicted, _ = self._total.popitem(last=False)
            self._last.pop(evicted, None)

    def current(self, task_id: str) -> float:
        """Joules accumulated so far for a running task (0 when none reported)."""
        return self._total.get(task_id, 0.0)

    def finish(self, task_id: str, kind: int) -> float:
        """The task ended: its joules since it last started, counted once in the per-kind total.

        :param kind: the task's ``TaskKind`` (unknown values count as unspecified).
        :returns: joules accumulated since the last :meth:`finish` of this task (0 when none).
        """
        joules = self._total.pop(task_id, 0.0)
        self._last.pop(task_id, None)
        label = TaskKind(kind).label if kind in TaskKind._value2member_map_ else TaskKind.UNSPECIFIED.label
        self.by_kind[label] += joules
        return joules

    def __len__(self) -> int:
        return len(self._total)
