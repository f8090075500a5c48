"""Queue order: a PENDING task becomes a placement :class:`~coordinator.domain.Request`, sorted by :func:`queue_key`."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from common.oci import CONTAINERS_LABEL
from common.pb.gptrm.v1 import types_pb2
from coordinator.domain import Request, Resources, queue_key
from coordinator.profiler import gpus_used

__all__ = ["queue_key", "request_for", "slack_key", "slack_s"]


def slack_s(deadline_s: float | None, now: float, expected_run_s: float) -> float:
    """How long a task may still wait and meet its deadline: ``deadline − now − expected run time``
    (infinite without a deadline)."""
    return math.inf if not deadline_s else deadline_s - now - expected_run_s


def slack_key(now: float, expected_run_s: Mapping[str, float]) -> Callable[[Request], tuple[int, float, float, str]]:
    """Queue order of the leader's cycle: priority (higher first), then slack (least first, no deadline
    last), then submit time and task id.

    :param now: the cycle's time (unix seconds).
    :param expected_run_s: task id → the profiler's expected run time; a task without one counts 0.
    """
    def key(req: Request) -> tuple[int, float, float, str]:
        return (-req.priority, slack_s(req.deadline_s, now, expected_run_s.get(req.task_id, 0.0)), req.submit_s,
                req.task_id)
    return key


def request_for(task: types_pb2.Task, expected_run_s: float | None = None) -> Request:
    """The placement request of a task: its per-node demand vector (GPU memory as the node total,
    from the per-GPU figure stored in ``Task.demand``), constraints and queue position, and the
    profiler's expected run time (read by the ``time-aware`` policy)."""
    d, spec = task.demand, task.spec
    return Request(
        task_id=task.id,
        demand=Resources(gpus=d.gpus, gpu_mem_total_bytes=d.gpu_mem_bytes * gpus_used(d.gpus), cpu_cores=d.cpu_cores,
                         mem_bytes=d.mem_bytes, disk_bytes=d.disk_bytes),
        nodes=max(1, spec.nodes), gpu_mem_per_gpu_bytes=d.gpu_mem_bytes, priority=spec.priority,
        submit_s=task.submit_unix_s, deadline_s=spec.qos.deadline_unix_s or None,
        gpu_model=spec.constraints.gpu_model,
        node_selector={**spec.constraints.node_selector, **({CONTAINERS_LABEL: "true"} if spec.image else {})},
        allow_sharing=spec.allow_gpu_sharing, expected_run_s=expected_run_s,
        avoid_nodes=frozenset(spec.constraints.avoid_nodes), image=spec.image,
        only_nodes=frozenset(spec.constraints.only_nodes),
    )
