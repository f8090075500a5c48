"""Task spec validation: reject what cannot or must not be scheduled, naming the field.

Re-exported by :mod:`coordinator.profiler.profiler` as :func:`validate_spec`.
"""

from __future__ import annotations

import math
import re
import time

from common.domain import Resources, TaskSpecData
from common.errors import ValidationError
from common.pb.gptrm.v1 import types_pb2
from coordinator.profiler.qos_spec import validate_qos_spec
from coordinator.profiler.taskspec import (
    MAX_ARG_BYTES,
    MAX_ARGV_BYTES,
    MAX_ARGV_ITEMS,
    MAX_AVOID_NODES,
    MAX_BATCH,
    MAX_BYTES,
    MAX_CONTEXT,
    MAX_CPU_CORES,
    MAX_ENV_BYTES,
    MAX_ENV_ITEMS,
    MAX_ENV_KEY_BYTES,
    MAX_ENV_VALUE_BYTES,
    MAX_GPUS,
    MAX_LABEL_KEY_BYTES,
    MAX_LABEL_VALUE_BYTES,
    MAX_LABELS,
    MAX_NAME_CHARS,
    MAX_NODES,
    MAX_PARAMS_BILLIONS,
    MAX_RESTARTS,
    MAX_SPEC_BYTES,
    MIN_GPU_SHARE,
    PRECISIONS,
    gpus_used,
    spec_data,
)

__all__ = ["validate_profiled_demand", "validate_sizes", "validate_spec"]

_USER_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
"""A POSIX user name as useradd accepts it (the agent still checks its own allowlist)."""

_INT32 = 2**31


def _number(path: str, value: float, *, high: float, positive: bool = False) -> None:
    """A finite number in ``[0, high]`` (``(0, high]`` when ``positive``)."""
    if not math.isfinite(value):
        raise ValidationError(path, f"must be a finite number, got {value!r}")
    if value < 0 or (positive and value == 0):
        raise ValidationError(path, f"must be {'> 0' if positive else '≥ 0'}, got {value!r}")
    if value > high:
        raise ValidationError(path, f"{value!r} is absurdly large (limit {high:g})")


def _validate_demand(demand: Resources, allow_sharing: bool, max_gpus_per_node: int) -> None:
    """The explicit per-node demand vector."""
    _number("spec.demand.gpus", demand.gpus, high=MAX_GPUS)
    per_gpu = demand.gpu_mem_total_bytes / max(1, gpus_used(demand.gpus))
    _number("spec.demand.gpu_mem_bytes", per_gpu, high=MAX_BYTES)
    _number("spec.demand.cpu_cores", demand.cpu_cores, high=MAX_CPU_CORES)
    _number("spec.demand.mem_bytes", demand.mem_bytes, high=MAX_BYTES)
    _number("spec.demand.disk_bytes", demand.disk_bytes, high=MAX_BYTES)
    if demand.is_zero():
        raise ValidationError("spec.demand", "is all zero; give at least one positive dimension or leave it out")
    if demand.gpus == 0 and demand.gpu_mem_total_bytes > 0:
        raise ValidationError("spec.demand.gpu_mem_bytes", "GPU memory is requested without any GPU")
    if demand.gpus > 1 and not float(demand.gpus).is_integer():
        raise ValidationError("spec.demand.gpus", f"must be a whole number above 1, got {demand.gpus!r}")
    if 0 < demand.gpus < MIN_GPU_SHARE:
        raise ValidationError("spec.demand.gpus", f"{demand.gpus!r} is below the smallest share ({MIN_GPU_SHARE})")
    if 0 < demand.gpus < 1 and not allow_sharing:
        raise ValidationError("spec.demand.gpus", f"a fraction ({demand.gpus!r}) needs allow_gpu_sharing: true")
    if max_gpus_per_node > 0 and demand.gpus > max_gpus_per_node:
        raise ValidationError(
            "spec.demand.gpus", f"{demand.gpus:g} GPUs per node, but no node has more than {max_gpus_per_node}"
        )


def _validate_model(spec: TaskSpecData) -> None:
    """The model description the profiler reads (needed only without an explicit demand)."""
    m = spec.model
    _number("spec.model.params_billions", m.params_billions, high=MAX_PARAMS_BILLIONS, positive=spec.demand is None)
    if m.precision.lower() not in PRECISIONS:
        raise ValidationError("spec.model.precision", f"unknown precision {m.precision!r} (one of {PRECISIONS})")
    _number("spec.model.context_length", m.context_length, high=MAX_CONTEXT)
    _number("spec.model.batch_size", m.batch_size, high=MAX_BATCH)
    _number("spec.model.layers", m.layers, high=100_000)
    _number("spec.model.hidden_size", m.hidden_size, high=1_000_000)


def _validate_shape(spec: TaskSpecData, max_gpus_per_node: int) -> None:
    """Gang size, replicas, GPUs per node, priority (never negative: 0 is the lowest)."""
    _number("spec.nodes", spec.nodes, high=MAX_NODES, positive=True)
    _number("spec.replicas", spec.replicas, high=10_000, positive=True)
    _number("spec.gpus_per_node", spec.gpus_per_node, high=MAX_GPUS)
    if max_gpus_per_node > 0 and spec.gpus_per_node > max_gpus_per_node:
        raise ValidationError(
            "spec.gpus_per_node", f"{spec.gpus_per_node} GPUs per node, but no node has more than {max_gpus_per_node}"
        )
    if not 0 <= spec.priority < _INT32:
        raise ValidationError("spec.priority", f"must be an integer in [0, {_INT32 - 1}] (higher runs first), "
                                               f"got {spec.priority}")


def _utf8(value: str) -> int:
    return len(value.encode("utf-8", "surrogatepass"))


def _validate_map(path: str, mapping: dict[str, str] | object, items: int, key_bytes: int, value_bytes: int,
                  total: int | None = None) -> None:
    if len(mapping) > items:   # type: ignore[arg-type]
        raise ValidationError(path, f"{len(mapping)} entries is more than {items}")   # type: ignore[arg-type]
    size = 0
    for k, v in mapping.items():   # type: ignore[attr-defined]
        if not k or _utf8(k) > key_bytes:
            raise ValidationError(f"{path}.{k[:40]}", f"key must be 1..{key_bytes} bytes")
        if _utf8(v) > value_bytes:
            raise ValidationError(f"{path}.{k[:40]}", f"value is {_utf8(v)} bytes, more than {value_bytes}")
        size += _utf8(k) + _utf8(v)
    if total is not None and size > total:
        raise ValidationError(path, f"{size} bytes in all is more than {total}")


def validate_sizes(spec: types_pb2.TaskSpec) -> None:
    """Size limits of a wire spec (documented in :mod:`coordinator.profiler.taskspec`), cheapest first.

    :raises ValidationError: naming the field that is too large.
    """
    size = spec.ByteSize()
    if size > MAX_SPEC_BYTES:
        raise ValidationError("spec", f"{size} bytes serialized is more than {MAX_SPEC_BYTES}")
    if len(spec.name) > MAX_NAME_CHARS:
        raise ValidationError("spec.name", f"{len(spec.name)} characters is more than {MAX_NAME_CHARS}")
    if len(spec.argv) > MAX_ARGV_ITEMS:
        raise ValidationError("spec.argv", f"{len(spec.argv)} arguments is more than {MAX_ARGV_ITEMS}")
    total = 0
    for i, arg in enumerate(spec.argv):
        n = _utf8(arg)
        if n > MAX_ARG_BYTES:
            raise ValidationError(f"spec.argv[{i}]", f"{n} bytes is more than {MAX_ARG_BYTES}")
        total += n
    if total > MAX_ARGV_BYTES:
        raise ValidationError("spec.argv", f"{total} bytes in all is more than {MAX_ARGV_BYTES}")
    _validate_map("spec.env", spec.env, MAX_ENV_ITEMS, MAX_ENV_KEY_BYTES, MAX_ENV_VALUE_BYTES, MAX_ENV_BYTES)
    _validate_map("spec.labels", spec.labels, MAX_LABELS, MAX_LABEL_KEY_BYTES, MAX_LABEL_VALUE_BYTES)
    _validate_map("spec.constraints.node_selector", spec.constraints.node_selector, MAX_LABELS,
                  MAX_LABEL_KEY_BYTES, MAX_LABEL_VALUE_BYTES)
    if len(spec.constraints.avoid_nodes) > MAX_AVOID_NODES:
        raise ValidationError("spec.constraints.avoid_nodes",
                              f"{len(spec.constraints.avoid_nodes)} nodes is more than {MAX_AVOID_NODES}")
    for i, node_id in enumerate(spec.constraints.avoid_nodes):
        if not 0 < _utf8(node_id) <= MAX_LABEL_KEY_BYTES:
            raise ValidationError(f"spec.constraints.avoid_nodes[{i}]", "not a node id")
    if spec.restart_policy not in types_pb2.RestartPolicy.values():
        raise ValidationError("spec.restart_policy", f"unknown value {spec.restart_policy}")
    if spec.max_restarts > MAX_RESTARTS:
        raise ValidationError("spec.max_restarts", f"{spec.max_restarts} is more than {MAX_RESTARTS}")


def validate_spec(spec: types_pb2.TaskSpec | TaskSpecData, max_gpus_per_node: int, *,
                  now: float | None = None) -> None:
    """Check a task spec before it is queued; the first problem found is raised.

    Refused: anything over the size limits (:func:`validate_sizes`: name, argv, env, labels,
    the whole serialized spec), an unknown restart policy, ``max_restarts`` above the bound;
    an unknown kind; an empty ``argv`` (or an empty program name); negative, NaN or
    infinite numbers; zero where a positive value is needed (gang size, replicas, the model size
    when no explicit demand is given, an all-zero demand); absurdly large values (more than 4096
    GPUs, more than 1 PiB of any memory or disk, more than 100,000 B parameters); GPU memory
    without GPUs; a fractional GPU above 1 or without ``allow_gpu_sharing``; more GPUs per node
    than any node has; an unknown precision; negative QoS targets or grace period; and the QoS
    fields :func:`~coordinator.profiler.qos_spec.validate_qos_spec` refuses (a deadline that has passed,
    a bad checkpoint signal or metrics endpoint); a negative priority.

    :param spec: the spec, wire or plain form.
    :param max_gpus_per_node: the most GPUs any known node has; 0 or less skips that check (no node
        has registered yet).
    :raises ValidationError: naming the dotted field (``spec.demand.gpus``) and the problem.
    """
    if isinstance(spec, types_pb2.TaskSpec):
        validate_sizes(spec)
    data = spec_data(spec)
    if not data.argv or not data.argv[0].strip():
        raise ValidationError("spec.argv", "must name the program to run")
    _validate_shape(data, max_gpus_per_node)
    _validate_model(data)
    if data.demand is not None:
        _validate_demand(data.demand, data.allow_gpu_sharing, max_gpus_per_node)
    for name in ("deadline_unix_s", "max_latency_ms", "min_tokens_per_s"):
        _number(f"spec.qos.{name}", getattr(data.qos, name), high=1e15)
    if isinstance(spec, types_pb2.TaskSpec):
        _number("spec.stop_grace_s", spec.stop_grace_s, high=86_400.0)
        validate_qos_spec(spec, time.time() if now is None else now)
        if spec.run_as_user and not _USER_RE.fullmatch(spec.run_as_user):
            raise ValidationError("spec.run_as_user", f"invalid user name {spec.run_as_user[:64]!r}")


def validate_profiled_demand(demand: Resources) -> None:
    """The demand the profiler derived from a model description must be placeable and storable.

    A spec can pass :func:`validate_spec` and still describe a model no cluster can hold (100,000 B
    parameters at fp32 with a 10M-token context): refused here, naming the model, instead of failing
    later while the demand is written.

    :raises ValidationError: on ``spec.model`` with the dimension that is out of range.
    """
    checks = (("GPUs", demand.gpus, MAX_GPUS),
              ("bytes of GPU memory", demand.gpu_mem_total_bytes, MAX_BYTES * MAX_GPUS),
              ("CPU cores", demand.cpu_cores, MAX_CPU_CORES), ("bytes of host memory", demand.mem_bytes, MAX_BYTES),
              ("bytes of disk", demand.disk_bytes, MAX_BYTES))
    for what, value, high in checks:
        if not math.isfinite(value) or value > high:
            raise ValidationError("spec.model", f"the profiled demand of {value:.4g} {what} is beyond any cluster "
                                                f"(limit {high:.4g}); give a smaller model or an explicit demand")
