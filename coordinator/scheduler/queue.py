"""Queue order: a PENDING task becomes a placement :class:`~coordinator.domain.Request`, sorted by :func:`queue_key`
(priority, then slack against the expected run time the request carries, then submit time)."""

from __future__ import annotations

from common.oci import CONTAINERS_LABEL
from common.pb.gptrm.v1 import types_pb2
from coordinator.domain import Request, Resources, queue_key
from coordinator.profiler import gpus_used

__all__ = ["queue_key", "request_for"]


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
