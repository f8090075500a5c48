"""A queue's run-time defaults applied to a task at submit (docs/limits-and-reservations.md)."""

from __future__ import annotations

from common.errors import ValidationError
from common.pb.gptrm.v1 import types_pb2
from coordinator.queues.model import Queue
from coordinator.run_limits import fmt_s

__all__ = ["apply_queue_limits"]


def apply_queue_limits(spec: types_pb2.TaskSpec, queue: Queue | None) -> types_pb2.TaskSpec:
    """The spec with its queue's run-time defaults filled in where it gives none (a copy; ``spec`` is unchanged).

    A task without a time limit gets the queue's default, else the queue's maximum (as Slurm's partitions do).

    :raises ValidationError: ``spec.time_limit_s`` above the queue's maximum.
    """
    if queue is None:
        return spec
    out = types_pb2.TaskSpec()
    out.CopyFrom(spec)
    most = queue.max_time_limit_s or 0.0
    if out.time_limit_s and most and out.time_limit_s > most:
        raise ValidationError("spec.time_limit_s", f"{fmt_s(out.time_limit_s)} is above queue {queue.name}'s "
                                                   f"maximum time limit of {fmt_s(most)}")
    if not out.time_limit_s:
        out.time_limit_s = queue.default_time_limit_s or most
    if not out.min_runtime_s and queue.default_min_runtime_s:
        out.min_runtime_s = queue.default_min_runtime_s
    if not out.stop_grace_s and queue.grace_s:
        out.stop_grace_s = queue.grace_s
    return out
