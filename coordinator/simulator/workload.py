"""Trace rows → what the coordinator's own code takes: a :class:`ClusterSnapshot` and requests.

Nodes get their power curve from :class:`coordinator.monitor.power_model.PowerModel` (datasheet
defaults per GPU model; a model the trace does not name is guessed from its GPU memory) and
fill what the trace leaves empty from :class:`NodeDefaults`.

Jobs become requests through :meth:`coordinator.profiler.profiler.Profiler.request`, the path a real
submission takes:

* a trace job that only carries a GPU count is a spec with an explicit demand (GPUs per node,
  or a shared fraction; host cores and memory when the trace gives them) and no model; the
  profiler fills the rest with its defaults (no per-GPU memory check: neither trace records GPU
  memory per job, and a whole GPU is reserved whole anyway);
* a synthetic LLM job (``kind`` and ``params_b`` set) is a spec with a model; the profiler
  derives its GPU count, per-GPU memory, cores, memory and disk from the model size.

A job asking for more GPUs than the widest node is a gang spread evenly over
``ceil(gpus / width)`` nodes (Philly's 16- and 32-GPU jobs on 8-GPU servers).

A job's priority comes from its ``group`` (openb QoS class; see :func:`coordinator.simulator.qos.priority_of`),
and so does its team queue (:func:`queue_name`: Philly's virtual clusters become queues).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import replace

from common.types import TaskKind
from coordinator.domain import (
    ClusterSnapshot,
    GpuSlot,
    ModelSpecData,
    NodeSnapshot,
    PowerCurve,
    Request,
    Resources,
    TaskSpecData,
)
from coordinator.monitor.power_model import PowerModel
from coordinator.profiler.profiler import DEFAULT_GPU_MEM_BYTES, Profiler
from coordinator.queues.model import DEFAULT_QUEUE
from coordinator.simulator.engine import SimJob
from coordinator.simulator.node_defaults import NodeDefaults
from coordinator.simulator.qos import priority_of
from coordinator.simulator.trace import TraceJob, TraceNode

__all__ = ["GIB", "NodeDefaults", "build_cluster", "build_jobs", "gang_split", "job_spec", "profiler_for",
           "queue_name", "without_run_estimates"]

GIB = 1024**3
_CPU_ONLY_WIDTH = 4  # a CPU-only node is sized like a 4-GPU server's host


def queue_name(group: str) -> str:
    """The team queue a trace ``group`` stands for: lower case, characters a queue name may not hold
    turned into ``-``, at most 63 characters; an empty group is the ``default`` queue.

    :param group: the trace's ``group`` column.
    :returns: a valid queue name (:data:`coordinator.queues.NAME_PATTERN`).
    """
    name = re.sub(r"[^a-z0-9-]", "-", group.strip().lower()).strip("-")[:63]
    return name or DEFAULT_QUEUE.name


def _node(node: TraceNode, defaults: NodeDefaults, power: PowerModel) -> NodeSnapshot:
    """One trace node as an idle, powered, schedulable snapshot."""
    gpus = node.gpus
    model = (node.gpu_model or defaults.gpu_model) if gpus else ""
    per_gpu = int((node.gpu_mem_gib or defaults.gpu_mem_gib) * GIB) if gpus else 0
    width = gpus or _CPU_ONLY_WIDTH
    cores = node.cpu_cores if node.cpu_cores is not None else defaults.cpu_cores_per_gpu * width
    mem = node.mem_gib if node.mem_gib is not None else defaults.mem_gib_per_gpu * width
    curve = power.curve(node.node_id, model, gpus, per_gpu) if gpus else PowerCurve(0.0, 0.0)
    host = defaults.host_idle_w
    return NodeSnapshot(
        node_id=node.node_id,
        capacity=Resources(float(gpus), per_gpu * gpus, float(cores), int(mem * GIB), int(defaults.disk_gib * GIB)),
        gpus=tuple(GpuSlot(index=k, mem_total_bytes=per_gpu, mem_free_bytes=per_gpu) for k in range(gpus)),
        gpu_model=model,
        power=PowerCurve(idle_w=curve.idle_w + host, max_w=curve.max_w + host),
    )


def build_cluster(
    nodes: Sequence[TraceNode], defaults: NodeDefaults = NodeDefaults(), power: PowerModel | None = None
) -> ClusterSnapshot:
    """The simulated cluster at time 0: every node idle and powered, in trace order.

    :param nodes: the trace nodes (their order is every policy's tie-break order).
    :param defaults: values for what the trace does not describe.
    :param power: the power model (a fresh one: datasheet curves).
    :returns: the snapshot.
    """
    model = power or PowerModel()
    return ClusterSnapshot(nodes=tuple(_node(n, defaults, model) for n in nodes), taken_at_s=0.0)


def gang_split(gpus: int, width: int) -> tuple[int, int]:
    """How a job of ``gpus`` whole GPUs spreads over nodes of at most ``width`` GPUs.

    :param gpus: GPUs the job asks for.
    :param width: GPUs of the widest node (≥ 1).
    :returns: ``(nodes, gpus per node)``; ``(1, gpus)`` when it fits on one node.
    """
    if gpus <= width:
        return 1, gpus
    nodes = math.ceil(gpus / width)
    return nodes, math.ceil(gpus / nodes)


def job_spec(job: TraceJob, width: int) -> TaskSpecData:
    """The task spec a trace job stands for (see the module docstring).

    :param job: the trace job.
    :param width: GPUs of the widest node.
    :returns: the spec to profile.
    """
    nodes, per_node = gang_split(job.gpus, width)
    cpu = (job.cpu_cores or 0.0) / nodes
    mem = int((job.mem_gib or 0.0) * GIB / nodes)
    if job.kind and job.params_b > 0:
        kind = TaskKind.parse(job.kind)
        model = ModelSpecData(name=f"llm-{job.params_b:g}b", params_billions=job.params_b)
        sharing = kind == TaskKind.INFERENCE and nodes == 1
        return TaskSpecData(name=job.job_id, kind=kind, model=model, nodes=nodes, allow_gpu_sharing=sharing,
                            priority=priority_of(job.group))
    gpus = job.gpu_share if 0 < job.gpu_share < 1 else float(per_node)
    return TaskSpecData(
        name=job.job_id,
        kind=TaskKind.TRAINING,
        demand=Resources(gpus=gpus, cpu_cores=cpu, mem_bytes=mem),
        nodes=nodes,
        allow_gpu_sharing=0 < gpus < 1,
        priority=priority_of(job.group),
    )


def profiler_for(nodes: Sequence[NodeSnapshot]) -> Profiler:
    """A profiler whose target GPU is the cluster's smallest, so an LLM job's per-GPU share fits anywhere.

    :param nodes: the cluster's nodes.
    :returns: the profiler.
    """
    sizes = [g.mem_total_bytes for n in nodes for g in n.gpus[:1]]
    return Profiler(gpu_model_mem_bytes=min(sizes) if sizes else DEFAULT_GPU_MEM_BYTES)


def build_jobs(jobs: Sequence[TraceJob], cluster: ClusterSnapshot, profiler: Profiler | None = None) -> list[SimJob]:
    """Trace jobs → simulator jobs, each with the request the profiler makes of its spec.

    :param jobs: the trace jobs.
    :param cluster: the cluster (its widest node decides gang splits).
    :param profiler: the profiler (default: :func:`profiler_for` the cluster).
    :returns: one job per trace job, in trace order.
    """
    width = max((len(n.gpus) for n in cluster.nodes), default=1) or 1
    prof = profiler or profiler_for(cluster.nodes)
    out: list[SimJob] = []
    for job in jobs:
        request: Request = prof.request(job.job_id, job_spec(job, width), submit_s=job.submit_s)
        # The profiler's expected run time of a replayed job is the trace's (the time-aware policy reads it).
        request = replace(request, expected_run_s=job.duration_s)
        out.append(SimJob(request=request, duration_s=job.duration_s, queue=queue_name(job.group)))
    return out


def without_run_estimates(jobs: Sequence[SimJob]) -> list[SimJob]:
    """The jobs as the leader's profiler sees them: no expected run time (it learns one per model or task name
    from tasks that succeeded, and a trace's jobs carry neither), where :func:`build_jobs` gives the trace's."""
    return [replace(j, request=replace(j.request, expected_run_s=None)) for j in jobs]
