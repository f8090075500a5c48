"""Plain data the scheduling pipeline works on.

The coordinator takes a :class:`ClusterSnapshot` at the start of each scheduling cycle, the
profiler turns each queued task into a :class:`Request`, and the placement engine answers each
request with a :class:`Placement` or a :class:`Rejection`. The trace-replay simulator builds the
same objects from a trace. No protobuf type appears here; conversion happens at the edges.

Units are in the field names. ``Resources.gpu_mem_total_bytes`` is a **node total** (the sum over the
GPUs a request uses on one node, or a node's total GPU memory), unlike ``ResourceVector`` on the
wire, where it is per GPU.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from common.topology import NodeTopology
from common.types import TaskKind

if TYPE_CHECKING:
    from common.pb.gptrm.v1 import types_pb2

__all__ = [
    "DIMENSIONS",
    "ClusterSnapshot",
    "Decision",
    "GpuSlot",
    "ModelSpecData",
    "NodeAssignment",
    "NodeId",
    "NodeSnapshot",
    "Placement",
    "PowerCurve",
    "QosData",
    "Rejection",
    "Request",
    "Resources",
    "TaskSpecData",
    "ended_at",
    "new_assignment",
    "new_placement",
    "queue_key",
]

NodeId = str
"""A node's stable id (the agent's ``--node-id``)."""

DIMENSIONS: tuple[str, ...] = ("gpus", "gpu_mem_total_bytes", "cpu_cores", "mem_bytes", "disk_bytes")
"""The resource dimensions, in the order every vectorised array uses."""


@dataclass(frozen=True, slots=True)
class Resources:
    """A demand or capacity vector over :data:`DIMENSIONS`.

    :param gpus: GPU compute in GPUs; a fraction below 1 means a share of one GPU.
    :param gpu_mem_total_bytes: GPU memory in bytes, summed over the node's GPUs (node total).
    :param cpu_cores: host CPU cores.
    :param mem_bytes: host memory in bytes.
    :param disk_bytes: local disk in bytes.
    """

    gpus: float = 0.0
    gpu_mem_total_bytes: int = 0
    cpu_cores: float = 0.0
    mem_bytes: int = 0
    disk_bytes: int = 0

    def add(self, other: Resources) -> Resources:
        """Return the element-wise sum.

        :param other: the vector to add.
        :returns: ``self + other``.
        """
        return Resources(
            gpus=self.gpus + other.gpus,
            gpu_mem_total_bytes=self.gpu_mem_total_bytes + other.gpu_mem_total_bytes,
            cpu_cores=self.cpu_cores + other.cpu_cores,
            mem_bytes=self.mem_bytes + other.mem_bytes,
            disk_bytes=self.disk_bytes + other.disk_bytes,
        )

    def sub(self, other: Resources) -> Resources:
        """Return the element-wise difference (may go negative; callers decide what that means).

        :param other: the vector to subtract.
        :returns: ``self - other``.
        """
        return Resources(
            gpus=self.gpus - other.gpus,
            gpu_mem_total_bytes=self.gpu_mem_total_bytes - other.gpu_mem_total_bytes,
            cpu_cores=self.cpu_cores - other.cpu_cores,
            mem_bytes=self.mem_bytes - other.mem_bytes,
            disk_bytes=self.disk_bytes - other.disk_bytes,
        )

    def scale(self, factor: int) -> Resources:
        """Return the vector multiplied by a whole number (e.g. a gang's node count).

        :param factor: the multiplier.
        :returns: ``factor × self``.
        """
        return Resources(
            gpus=self.gpus * factor,
            gpu_mem_total_bytes=self.gpu_mem_total_bytes * factor,
            cpu_cores=self.cpu_cores * factor,
            mem_bytes=self.mem_bytes * factor,
            disk_bytes=self.disk_bytes * factor,
        )

    def as_tuple(self) -> tuple[float, int, float, int, int]:
        """Return the values in :data:`DIMENSIONS` order.

        :returns: ``(gpus, gpu_mem_total_bytes, cpu_cores, mem_bytes, disk_bytes)``.
        """
        return (self.gpus, self.gpu_mem_total_bytes, self.cpu_cores, self.mem_bytes, self.disk_bytes)

    def is_zero(self) -> bool:
        """Whether every dimension is zero.

        :returns: True for the empty vector.
        """
        return not any(self.as_tuple())


@dataclass(frozen=True, slots=True)
class GpuSlot:
    """One GPU of a node as the scheduler sees it.

    :param index: the GPU's index on its node (NVML index).
    :param mem_total_bytes: the GPU's memory.
    :param mem_free_bytes: memory not reserved by allocations.
    :param share_free: compute share not reserved, 0..1 (1: the whole GPU is free).
    :param topology_group: GPUs with the same group share an NVLink domain / PCIe switch; -1 unknown.
    :param degraded: its agent reports it DEGRADED (throttling, a link down): chosen last on its node.
    """

    index: int
    mem_total_bytes: int
    mem_free_bytes: int
    share_free: float = 1.0
    topology_group: int = -1
    degraded: bool = False


@dataclass(frozen=True, slots=True)
class PowerCurve:
    """A node's power as a linear function of its compute utilization.

    :param idle_w: power at zero utilization, in watts.
    :param max_w: power at full utilization, in watts.
    """

    idle_w: float
    max_w: float

    def power(self, util: float) -> float:
        """Predicted power at a compute utilization.

        :param util: compute utilization, 0..1.
        :returns: ``idle_w + (max_w - idle_w) · util`` in watts.
        """
        return self.idle_w + (self.max_w - self.idle_w) * util


@dataclass(frozen=True, slots=True)
class NodeSnapshot:
    """One node at the start of a scheduling cycle.

    :param node_id: the node's id.
    :param capacity: what the node has (``gpu_mem_total_bytes`` summed over its GPUs).
    :param used: what committed allocations have reserved on it.
    :param gpus: per-GPU state, in index order.
    :param gpu_model: GPU model name (e.g. ``NVIDIA H100 80GB HBM3``), "" for CPU-only nodes.
    :param labels: node labels matched by a request's node selector.
    :param schedulable: False when cordoned, draining, not ready or lost.
    :param powered_on: False when the node is asleep/powered down (waking it costs its idle power).
    :param power: the node's power curve (all GPUs together).
    :param topology: its GPUs' links and NUMA placement when its agent reported them (built once
        per registration, shared by every snapshot of the node); None unknown.
    :param images: the container images its store holds (references as submitted); a request with an image
        prefers such a node among nodes its policy ranks equal.
    """

    node_id: NodeId
    capacity: Resources
    used: Resources = field(default_factory=Resources)
    gpus: tuple[GpuSlot, ...] = ()
    gpu_model: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    schedulable: bool = True
    powered_on: bool = True
    power: PowerCurve = field(default_factory=lambda: PowerCurve(idle_w=0.0, max_w=0.0))
    topology: NodeTopology | None = None
    images: frozenset[str] = frozenset()

    @property
    def compute_util(self) -> float:
        """GPU compute utilization ``used.gpus / capacity.gpus`` (0 for a node without GPUs).

        :returns: a fraction, 0..1 for a consistent snapshot.
        """
        if self.capacity.gpus <= 0:
            return 0.0
        return self.used.gpus / self.capacity.gpus


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    """Every node at one instant, in a fixed order (the tie-break order of every policy).

    :param nodes: the nodes; their order is part of the input.
    :param taken_at_s: when the snapshot was taken (unix seconds or simulated seconds).
    """

    nodes: tuple[NodeSnapshot, ...]
    taken_at_s: float = 0.0

    def by_id(self) -> dict[NodeId, NodeSnapshot]:
        """Index the nodes by id.

        :returns: ``{node_id: node}``.
        """
        return {node.node_id: node for node in self.nodes}


@dataclass(frozen=True, slots=True)
class Request:
    """One task waiting for a placement, as the placement engine sees it.

    :param task_id: the task's id.
    :param demand: resources needed on **each** node (``gpu_mem_total_bytes`` is this node's total).
    :param nodes: gang size: the task needs this many distinct nodes, all or nothing.
    :param gpu_mem_per_gpu_bytes: memory each of its GPUs must have free (0: no per-GPU check).
    :param priority: higher runs first.
    :param submit_s: submission time (unix or simulated seconds).
    :param deadline_s: QoS deadline, None when there is none.
    :param gpu_model: substring the node's GPU model must contain, "" for any.
    :param node_selector: labels the node must carry with exactly these values.
    :param allow_sharing: whether a fractional ``demand.gpus`` (< 1) may share a GPU with others.
    :param expected_run_s: the profiler's expected run time (the trace's in the simulator), None when
        unknown; only the ``time-aware`` policy reads it.
    :param avoid_nodes: nodes it must not go to (a service's replica avoids its siblings' nodes; ``--exclude``).
    :param image: the container image it runs in ("" none): among nodes ranked equal, one holding it is chosen
        (not part of :attr:`shape`: it decides no node's feasibility).
    :param only_nodes: the nodes it may go to (``--nodelist``); empty: any.
    """

    task_id: str
    demand: Resources
    nodes: int = 1
    gpu_mem_per_gpu_bytes: int = 0
    priority: int = 0
    submit_s: float = 0.0
    deadline_s: float | None = None
    gpu_model: str = ""
    node_selector: Mapping[str, str] = field(default_factory=dict)
    allow_sharing: bool = False
    expected_run_s: float | None = None
    avoid_nodes: frozenset[str] = frozenset()
    image: str = ""
    only_nodes: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        """Refuse a gang of fewer than one node (nothing could be placed all-or-nothing)."""
        if self.nodes < 1:
            raise ValueError(f"request {self.task_id!r}: nodes must be ≥ 1, got {self.nodes}")

    @property
    def compute_demand(self) -> float:
        """Total GPU compute over the gang (the key Algorithms 1-3 sort requests by).

        :returns: ``demand.gpus × nodes``.
        """
        return self.demand.gpus * self.nodes

    @property
    def shape(self) -> tuple[object, ...]:
        """Everything the placement decision depends on except the request's identity and queue
        position: two requests of one shape are accepted by the same nodes.

        :returns: a hashable key.
        """
        return self.demand.as_tuple(), self.nodes, self.gpu_mem_per_gpu_bytes, self.constraint_key, self.allow_sharing

    @property
    def constraint_key(self) -> tuple[str, frozenset[tuple[str, str]], frozenset[str], frozenset[str]] | None:
        """The request's constraints as one hashable value, None when it has none.

        :returns: ``(GPU model lower-cased, node selector items, nodes to avoid, nodes allowed)``, or None.
        """
        if not self.gpu_model and not self.node_selector and not self.avoid_nodes and not self.only_nodes:
            return None
        return self.gpu_model.lower(), frozenset(self.node_selector.items()), self.avoid_nodes, self.only_nodes

    @property
    def whole_gpus(self) -> int:
        """Whole GPUs needed on each node (0 for a shared fraction or a CPU-only task).

        :returns: ``ceil(demand.gpus)`` unless the demand is a shared fraction below one GPU.
        """
        if self.demand.gpus <= 0 or (self.demand.gpus < 1 and self.allow_sharing):
            return 0
        return math.ceil(self.demand.gpus)


@dataclass(frozen=True, slots=True)
class NodeAssignment:
    """The part of a placement on one node.

    :param node_id: the node.
    :param gpu_indices: the GPUs reserved for the task on it.
    :param gpu_share: fraction of each of those GPUs (1.0 for whole GPUs).
    """

    node_id: NodeId
    gpu_indices: tuple[int, ...]
    gpu_share: float = 1.0


@dataclass(frozen=True, slots=True)
class Placement:
    """A successful decision: where a request runs.

    :param task_id: the task placed.
    :param assignments: one entry per node of the gang, in the order chosen.
    :param demand: what was reserved on each of those nodes.
    :param policy: name of the policy that chose it.
    """

    task_id: str
    assignments: tuple[NodeAssignment, ...]
    demand: Resources
    policy: str = ""

    @property
    def node_ids(self) -> tuple[NodeId, ...]:
        """The nodes chosen, in order.

        :returns: one id per assignment.
        """
        return tuple(a.node_id for a in self.assignments)


_new_object = object.__new__
_slots = vars(NodeAssignment)
_set_node_id, _set_gpu_indices, _set_gpu_share = (
    _slots["node_id"].__set__, _slots["gpu_indices"].__set__, _slots["gpu_share"].__set__)
_slots = vars(Placement)
_set_task_id, _set_assignments, _set_demand, _set_policy = (
    _slots["task_id"].__set__, _slots["assignments"].__set__, _slots["demand"].__set__, _slots["policy"].__set__)


def new_assignment(node_id: NodeId, gpu_indices: tuple[int, ...], gpu_share: float) -> NodeAssignment:
    """``NodeAssignment(node_id, gpu_indices, gpu_share)``, built by writing its slots directly: the
    generated ``__init__`` of a frozen class calls ``object.__setattr__`` per field, which costs the
    placement engine, which builds one per node chosen, a noticeable part of a decision.

    :returns: the assignment (equal to the constructor's).
    """
    a = _new_object(NodeAssignment)
    _set_node_id(a, node_id)
    _set_gpu_indices(a, gpu_indices)
    _set_gpu_share(a, gpu_share)
    return a


def new_placement(task_id: str, assignments: tuple[NodeAssignment, ...], demand: Resources,
                  policy: str) -> Placement:
    """``Placement(task_id, assignments, demand, policy)`` built as :func:`new_assignment` builds an assignment.

    :returns: the placement (equal to the constructor's).
    """
    p = _new_object(Placement)
    _set_task_id(p, task_id)
    _set_assignments(p, assignments)
    _set_demand(p, demand)
    _set_policy(p, policy)
    return p


@dataclass(frozen=True, slots=True)
class Rejection:
    """A request that could not be placed this cycle; it keeps waiting.

    :param task_id: the task.
    :param reason: one human-readable sentence, e.g.
        ``"no node with 4 free GPUs of ≥ 80 GiB under threshold 0.9"``.
    :param node_reasons: ``(node_id, short reason)`` pairs for (a bounded sample of) the nodes refused.
    :param scale_out: True when the policy asks the node provider for a new node (Alg. 1/2).
    """

    task_id: str
    reason: str
    node_reasons: tuple[tuple[NodeId, str], ...] = ()
    scale_out: bool = False


Decision = Placement | Rejection
"""What the placement engine answers for one request."""


@dataclass(frozen=True, slots=True)
class ModelSpecData:
    """Plain form of ``gptrm.v1.ModelSpec``.

    :param name: model name; the profiler learns corrections per name.
    :param params_billions: parameter count in billions.
    :param precision: ``fp32 | bf16 | fp16 | fp8 | int8 | int4``.
    :param context_length: tokens of context (inference KV cache).
    :param batch_size: sequences per batch.
    :param layers: transformer layers, 0 to estimate from the parameter count.
    :param hidden_size: hidden width, 0 to estimate from the parameter count.
    """

    name: str = ""
    params_billions: float = 0.0
    precision: str = "bf16"
    context_length: int = 0
    batch_size: int = 0
    layers: int = 0
    hidden_size: int = 0


@dataclass(frozen=True, slots=True)
class QosData:
    """Plain form of ``gptrm.v1.QosSpec``; 0 means "none" in each field.

    :param deadline_unix_s: finish-by time.
    :param max_latency_ms: per-request latency target for inference.
    :param min_tokens_per_s: throughput target.
    """

    deadline_unix_s: float = 0.0
    max_latency_ms: float = 0.0
    min_tokens_per_s: float = 0.0


@dataclass(frozen=True, slots=True)
class TaskSpecData:
    """Plain form of ``gptrm.v1.TaskSpec`` (what the profiler and the simulator read).

    :param name: task name.
    :param kind: training, fine-tuning or inference.
    :param model: the model it runs.
    :param demand: explicit per-node demand overriding the profile, None to profile.
    :param replicas: inference replicas (≥ 1).
    :param nodes: gang size (≥ 1).
    :param gpus_per_node: GPUs on each node, 0 to take them from demand/profile.
    :param priority: higher first.
    :param qos: QoS targets.
    :param argv: the command to run.
    :param env: extra environment variables.
    :param labels: task labels.
    :param gpu_model: constraint: substring of the GPU model, "" for any.
    :param node_selector: constraint: node labels that must match exactly.
    :param allow_gpu_sharing: whether a fractional GPU share is acceptable.
    :param preemptible: whether higher-priority work may preempt the task.
    :param checkpoint_signal: signal name sent before a preemption stop, "" for the default (SIGUSR1).
    """

    name: str = ""
    kind: TaskKind = TaskKind.INFERENCE
    model: ModelSpecData = field(default_factory=ModelSpecData)
    demand: Resources | None = None
    replicas: int = 1
    nodes: int = 1
    gpus_per_node: int = 0
    priority: int = 0
    qos: QosData = field(default_factory=QosData)
    argv: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    gpu_model: str = ""
    node_selector: Mapping[str, str] = field(default_factory=dict)
    allow_gpu_sharing: bool = False
    preemptible: bool = True
    checkpoint_signal: str = ""


def queue_key(req: Request) -> tuple[int, float, float, str]:
    """Sort key for the pending queue, the one order of the leader's cycle and the simulator: priority
    (higher first), then slack (least first, none last), then submit time (earlier first), then task id so
    the order is total.

    The slack of a task with a deadline is ``deadline − now − expected run time`` (the profiler's,
    :attr:`Request.expected_run_s`; 0 without one); ``now`` is the same for every task of a queue, so the key
    holds ``deadline − expected run time`` and stays valid as time passes (a heap of pending requests never
    needs re-keying).

    Example: ``pending.sort(key=queue_key)``.

    :param req: a waiting request.
    :returns: a tuple that sorts ascending into queue order.
    """
    slack = req.deadline_s - (req.expected_run_s or 0.0) if req.deadline_s else math.inf
    return (-req.priority, slack, req.submit_s, req.task_id)


def ended_at(task: types_pb2.Task) -> float:
    """When a finished task ended (its last history entry), else its submit time."""
    return task.history[-1].time_unix_s if task.history else task.submit_unix_s
