"""Elastic task specs: the size range of a training job that grows and shrinks (``TaskSpec.elastic``).

Two forms, not both:

- ``min_gpus..max_gpus``: GPUs on one node (``gptrmctl submit --gpus 1:4``);
- ``min_nodes..max_nodes``: whole nodes of ``gpus_per_node`` GPUs each (``--nodes 2:8 --gpus-per-node 8``).

Only training and fine-tuning tasks are elastic (an inference service scales by replicas). A resize is a
checkpoint-restart, so the task must be restartable from its checkpoints; sharing a GPU is refused.
"""

from __future__ import annotations

import math

from common.errors import ValidationError
from common.pb.gptrm.v1 import types_pb2
from common.qos import metric_name_problem
from coordinator.elastic.rules import ElasticRange, SpeedupCurve

__all__ = ["MAX_ELASTIC_GPUS", "curve_of", "elastic_gpus", "elastic_range", "is_elastic", "metrics_mapping_of",
           "validate_elastic"]

MAX_ELASTIC_GPUS = 4096
_KINDS = (types_pb2.TASK_KIND_TRAINING, types_pb2.TASK_KIND_FINE_TUNING)


def is_elastic(spec: types_pb2.TaskSpec) -> bool:
    """Whether the spec asks for an elastic size."""
    return spec.HasField("elastic")


def elastic_gpus(task: types_pb2.Task) -> int:
    """GPUs its allocation holds (an elastic task's size now; 0 while it holds none)."""
    return sum(len(na.gpu_indices) for na in task.allocation.nodes)


def elastic_range(spec: types_pb2.TaskSpec) -> ElasticRange | None:
    """The sizes an elastic spec may run at (None for a task of fixed size). The spec was validated."""
    if not spec.HasField("elastic"):
        return None
    e = spec.elastic
    if e.min_nodes or e.max_nodes:
        width = max(1, spec.gpus_per_node)
        return ElasticRange(max(1, e.min_nodes) * width, max(1, e.max_nodes) * width, width)
    return ElasticRange(max(1, e.min_gpus), max(1, e.max_gpus), max(1, e.max_gpus))


def validate_elastic(spec: types_pb2.TaskSpec, max_gpus_per_node: int) -> None:
    """Check an elastic spec at submit.

    Refused: a kind other than training or fine-tuning; a service, replicas or a shared GPU; both forms
    or neither; a minimum of 0 or a maximum below it; GPUs beyond the largest node (``max_gpus``) or
    beyond :data:`MAX_ELASTIC_GPUS`; the node form without ``gpus_per_node`` or with a fixed ``nodes``;
    a throughput counter that is not a metric name, or without a metrics endpoint.

    :param max_gpus_per_node: the most GPUs any known node has (0: none known, not checked).
    :raises ValidationError: naming the field.
    """
    if not spec.HasField("elastic"):
        return
    e = spec.elastic
    if spec.kind not in _KINDS:
        raise ValidationError("spec.elastic", "only training and fine-tuning tasks are elastic")
    if spec.HasField("service") or spec.replicas > 1:
        raise ValidationError("spec.elastic", "a service scales by replicas, not by an elastic size")
    if spec.allow_gpu_sharing:
        raise ValidationError("spec.elastic", "an elastic task uses whole GPUs (no allow_gpu_sharing)")
    by_gpus, by_nodes = bool(e.min_gpus or e.max_gpus), bool(e.min_nodes or e.max_nodes)
    if by_gpus == by_nodes:
        raise ValidationError("spec.elastic", "give min_gpus:max_gpus (one node) or min_nodes:max_nodes, one of them")
    lo, hi, what = (e.min_gpus, e.max_gpus, "gpus") if by_gpus else (e.min_nodes, e.max_nodes, "nodes")
    if lo < 1:
        raise ValidationError(f"spec.elastic.min_{what}", f"must be ≥ 1, got {lo}")
    if hi < lo:
        raise ValidationError(f"spec.elastic.max_{what}", f"{hi} is below min_{what} {lo}")
    if by_gpus:
        if spec.nodes > 1:
            raise ValidationError("spec.nodes", "an elastic task in GPUs runs on one node; give min_nodes:max_nodes "
                                                "for a multi-node job")
        if hi > MAX_ELASTIC_GPUS or (max_gpus_per_node > 0 and hi > max_gpus_per_node):
            limit = min(MAX_ELASTIC_GPUS, max_gpus_per_node) if max_gpus_per_node > 0 else MAX_ELASTIC_GPUS
            raise ValidationError("spec.elastic.max_gpus", f"{hi} GPUs on one node, but no node has more than {limit}")
    else:
        if spec.nodes > 1:
            raise ValidationError("spec.nodes", "give the node count as min_nodes:max_nodes, not spec.nodes")
        if spec.gpus_per_node < 1:
            raise ValidationError("spec.gpus_per_node", "an elastic multi-node task needs gpus_per_node")
        if hi * spec.gpus_per_node > MAX_ELASTIC_GPUS:
            raise ValidationError("spec.elastic.max_nodes",
                                  f"{hi} nodes × {spec.gpus_per_node} GPUs is more than {MAX_ELASTIC_GPUS}")
    if e.throughput_counter:
        problem = metric_name_problem(e.throughput_counter)
        if problem is not None:
            raise ValidationError("spec.elastic.throughput_counter", problem)
        if not (spec.metrics_port or spec.metrics_url):
            raise ValidationError("spec.elastic.throughput_counter", "is read from the task's metrics: give "
                                                                     "metrics_port or metrics_url")


def metrics_mapping_of(spec: types_pb2.TaskSpec) -> types_pb2.MetricsMapping:
    """The metrics mapping its agent scrapes with: an elastic task's throughput counter read as the rate the
    agent derives for ``tokens_counter`` (a mapping the spec gives keeps its own names)."""
    if not (spec.HasField("elastic") and spec.elastic.throughput_counter):
        return spec.metrics_mapping
    mapping = types_pb2.MetricsMapping()
    mapping.CopyFrom(spec.metrics_mapping)
    if not mapping.tokens_counter:
        mapping.tokens_counter = spec.elastic.throughput_counter
        mapping.flavour = mapping.flavour or "custom"
    return mapping


def curve_of(task: types_pb2.Task) -> SpeedupCurve:
    """The speed-up curve stored with a task (values that are not positive and finite are dropped)."""
    pts = {p.gpus: p.throughput for p in task.elastic.curve
           if 0 < p.gpus <= 4096 and math.isfinite(p.throughput) and p.throughput > 0}
    return SpeedupCurve(tuple(sorted(pts.items())))
