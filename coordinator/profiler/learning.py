"""Learning from finished tasks: what a task really used corrects the profiler's next estimate for its model."""

from __future__ import annotations

import math
from typing import Protocol

import numpy as np

from common.pb.gptrm.v1 import types_pb2
from common.types import TaskState
from coordinator.profiler.profiler import Profiler

__all__ = ["UsageHistory", "learn_from_task", "learn_run_time"]


class UsageHistory(Protocol):
    """A node's telemetry history (``coordinator.monitor.NodeHistory``)."""

    def series(self, field: str, gpu_index: int | None = None, stat: str = "mean") -> tuple[np.ndarray, np.ndarray]:
        """(times, values) of one field, for one GPU: per sample lately, per-minute ``stat`` (mean or max) before."""


def learn_from_task(profiler: Profiler, task: types_pb2.Task, history: UsageHistory | None) -> bool:
    """Feed a finished task's peak GPU memory and mean utilization (since it started running, on its
    first node's GPUs) to the profiler.

    :param profiler: the profiler to correct.
    :param task: the finished task.
    :param history: telemetry of the task's first node, None when there is none.
    :returns: True when the profiler learned something.
    """
    if not task.spec.model.name or not task.allocation.nodes or history is None:
        return False
    na = task.allocation.nodes[0]
    if not na.gpu_indices:
        return False
    started = next((h.time_unix_s for h in task.history if h.state == TaskState.RUNNING), 0.0)
    peak_mem, utils = 0.0, []
    for i in na.gpu_indices:
        times, mem = history.series("mem_used_bytes", i, stat="max")   # older history: the peak of each minute
        _, util = history.series("util_gpu", i)
        window = times >= started
        if window.any():
            peak_mem = max(peak_mem, float(mem[window].max()))
            utils.append(_time_mean(times[window], util[window]))
    if peak_mem <= 0 or not utils:
        return False
    profiler.observe(task.spec, int(peak_mem), sum(utils) / len(utils))
    return True


def _time_mean(times: np.ndarray, values: np.ndarray) -> float:
    """Mean of a series weighted by the time each value stands for (until the next one; the last one as
    long as the one before it), so that a per-minute mean of older history counts as its minute, not as
    one sample; the plain mean when the times give no weights."""
    present = ~np.isnan(values)
    times, values = times[present], values[present]
    if len(values) < 2:
        return float(values.mean()) if len(values) else math.nan
    spans = np.diff(times)
    weights = np.clip(np.append(spans, spans[-1]), 0.0, None)
    return float(np.average(values, weights=weights)) if weights.sum() > 0 else float(values.mean())


def learn_run_time(profiler: Profiler, task: types_pb2.Task) -> bool:
    """Feed a task that succeeded its run time (last start to end) to the profiler; True when it learned."""
    if task.state != TaskState.SUCCEEDED or len(task.history) < 2:
        return False
    started = next((h.time_unix_s for h in reversed(task.history) if h.state == TaskState.RUNNING), None)
    if started is None:
        return False
    profiler.observe_run(task.spec, task.history[-1].time_unix_s - started)
    return True
