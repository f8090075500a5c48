"""Task spec validation: reject what cannot or must not be scheduled, naming the field.

Re-exported by :mod:`coordinator.profiler.profiler` as :func:`validate_spec`.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping, Sequence

from common.errors import ValidationError
from common.oci import validate_container
from common.pb.gptrm.v1 import types_pb2
from coordinator.domain import Resources, TaskSpecData
from coordinator.elastic.spec import validate_elastic
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
    MAX_REPLICAS,
    MAX_RESTARTS,
    MAX_SPEC_BYTES,
    MIN_BYTES,
    MIN_CPU_CORES,
    MIN_GPU_SHARE,
    PRECISIONS,
    gpus_used,
    spec_data,
)
from coordinator.profiler.workflow_spec import validate_workflow
from coordinator.run_limits import MAX_TIME_LIMIT_S

__all__ = ["validate_argv_env", "validate_profiled_demand", "validate_pty", "validate_service", "validate_sizes",
           "validate_spec"]

_USER_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
_QUEUE_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
"""A POSIX user name as useradd accepts it (the agent still checks its own allowlist)."""
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
"""An environment variable name the agent accepts (what a shell can name)."""

_INT32 = 2**31


def _number(path: str, value: float, *, high: float, positive: bool = False) -> None:
    """A finite number in ``[0, high]`` (``(0, high]`` when ``positive``)."""
    if not math.isfinite(value):
        raise ValidationError(path, f"must be a finite number, got {value!r}")
    if value < 0 or (positive and value == 0):
        raise ValidationError(path, f"must be {'> 0' if positive else '≥ 0'}, got {value!r}")
    if value > high:
        raise ValidationError(path, f"{value!r} is absurdly large (limit {high:g})")


def _at_least(path: str, value: float, low: float, unit: str) -> None:
    """A demand that is 0 (none) or at least ``low``: a vanishing demand (``5e-324`` cores) is no demand
    anyone meant, and would let tasks pile up on a node without limit."""
    if 0 < value < low:
        least = f"{int(low)} bytes (1 MiB)" if unit == "bytes" and low == 1 << 20 else f"{low:g} {unit}"
        shown = f"{int(value)} bytes" if unit == "bytes" else f"{value!r} {unit}"
        raise ValidationError(path, f"{shown} is below the smallest demand, {least}; give 0 for none")


def _validate_demand(demand: Resources, allow_sharing: bool, max_gpus_per_node: int) -> None:
    """The explicit per-node demand vector."""
    _number("spec.demand.gpus", demand.gpus, high=MAX_GPUS)
    per_gpu = demand.gpu_mem_total_bytes / max(1, gpus_used(demand.gpus))
    _number("spec.demand.gpu_mem_bytes", per_gpu, high=MAX_BYTES)
    _number("spec.demand.cpu_cores", demand.cpu_cores, high=MAX_CPU_CORES)
    _number("spec.demand.mem_bytes", demand.mem_bytes, high=MAX_BYTES)
    _number("spec.demand.disk_bytes", demand.disk_bytes, high=MAX_BYTES)
    _at_least("spec.demand.cpu_cores", demand.cpu_cores, MIN_CPU_CORES, "cores")
    _at_least("spec.demand.gpu_mem_bytes", per_gpu, MIN_BYTES, "bytes")
    _at_least("spec.demand.mem_bytes", demand.mem_bytes, MIN_BYTES, "bytes")
    _at_least("spec.demand.disk_bytes", demand.disk_bytes, MIN_BYTES, "bytes")
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
    """The model description the profiler reads (its size is needed for a named model without an explicit demand)."""
    m = spec.model
    # A named model is sized from its parameters unless an explicit demand is given; a spec with
    # neither a model nor a demand gets the profiler's default (one CPU core).
    named = bool(m.name.strip())
    _number("spec.model.params_billions", m.params_billions, high=MAX_PARAMS_BILLIONS,
            positive=named and spec.demand is None)
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


def validate_argv_env(argv: Sequence[str], env: Mapping[str, str]) -> None:
    """What ``execve`` cannot pass: a NUL byte in an argument, an environment key or value, or a key
    that is not a variable name (``^[A-Za-z_][A-Za-z0-9_]*$``: no ``=``, no leading digit).

    Checked at submit (and by gptrmctl on its own input) so the task is refused naming the field
    instead of failing on its node.

    :raises ValidationError: ``spec.argv[i]``, ``spec.env`` (a bad key) or ``spec.env.KEY`` (a bad value).
    """
    for i, arg in enumerate(argv):
        if "\0" in arg:
            raise ValidationError(f"spec.argv[{i}]", "contains a NUL byte")
    for key, value in env.items():
        if "\0" in key:
            raise ValidationError("spec.env", f"key {_show(key)} contains a NUL byte")
        if not _ENV_NAME_RE.fullmatch(key):
            raise ValidationError("spec.env", f"key {_show(key)} is not a valid variable name (letters, digits "
                                              "and _, not starting with a digit)")
        if "\0" in value:
            raise ValidationError(f"spec.env.{key}", "value contains a NUL byte")


def _show(text: str, limit: int = 64) -> str:
    """``text`` quoted for an error message, cut to ``limit`` characters."""
    return repr(text[:limit]) + ("…" if len(text) > limit else "")


def validate_service(spec: types_pb2.TaskSpec, *, cluster_gpus: int = 0, gpus_per_replica: int = 1) -> None:
    """The service part of a spec (``spec.service`` with its scaling signal), wherever a spec carries one.

    The one check of that part: ``SubmitTask`` (through :func:`validate_spec`, without the cluster's
    size) and ``CreateService`` (with it) both call it.

    :param cluster_gpus: GPUs of every node that is not lost (0: not known, not checked).
    :param gpus_per_replica: GPUs one replica occupies.
    :raises ValidationError: MIN below 1 or above MAX, MAX above :data:`MAX_REPLICAS` or above what the
        cluster's GPUs could ever hold, a target utilization that is not a number in (0, 1], no signal or
        more than one, a QoS signal without a metrics endpoint, metrics ports beyond 65535.
    """
    svc = spec.service
    lo, hi = svc.min_replicas, svc.max_replicas
    if lo < 1:
        raise ValidationError("spec.service.min_replicas", f"must be at least 1, got {lo}")
    if hi < lo:
        raise ValidationError("spec.service.max_replicas", f"MIN {lo} > MAX {hi}")
    if hi > MAX_REPLICAS:
        raise ValidationError("spec.service.max_replicas", f"{hi} is above the limit of {MAX_REPLICAS} replicas")
    if cluster_gpus and hi * gpus_per_replica > cluster_gpus:
        raise ValidationError("spec.service.max_replicas",
                              f"{hi} replicas of {gpus_per_replica} GPU(s) exceed the cluster's {cluster_gpus} GPUs")
    if svc.target_util and (not math.isfinite(svc.target_util) or not 0 < svc.target_util <= 1):
        raise ValidationError("spec.service.target_util", f"must be in (0, 1], got {svc.target_util}")
    signals = [name for name, value in (("spec.service.target_util", svc.target_util),
                                        ("spec.qos.max_latency_ms", spec.qos.max_latency_ms),
                                        ("spec.qos.min_tokens_per_s", spec.qos.min_tokens_per_s)) if value]
    if not signals:
        raise ValidationError("spec.service", "a service needs a signal to scale on: --target-util, "
                                              "--max-latency-ms or --min-tokens-per-s")
    if len(signals) > 1:
        raise ValidationError(signals[1], f"give one scaling signal, got {', '.join(signals)}")
    if signals[0].startswith("spec.qos") and not (spec.metrics_port or spec.metrics_url):
        raise ValidationError("spec.metrics_port", f"{signals[0]} is read from the replicas' metrics: "
                                                   "give --metrics-port")
    if spec.metrics_port and spec.metrics_port + hi - 1 > 65535:
        raise ValidationError("spec.metrics_port", f"{spec.metrics_port} + {hi - 1} replicas is above 65535")


def _utf8(value: str) -> int:
    return len(value.encode("utf-8", "surrogatepass"))


def _validate_map(path: str, mapping: Mapping[str, str], items: int, key_bytes: int, value_bytes: int,
                  total: int | None = None) -> None:
    if len(mapping) > items:
        raise ValidationError(path, f"{len(mapping)} entries is more than {items}")
    size = 0
    for k, v in mapping.items():
        if not k or _utf8(k) > key_bytes:
            raise ValidationError(f"{path}.{k[:40]}", f"key must be 1..{key_bytes} bytes")
        if _utf8(v) > value_bytes:
            raise ValidationError(f"{path}.{k[:40]}", f"value is {_utf8(v)} bytes, more than {value_bytes}")
        size += _utf8(k) + _utf8(v)
    if total is not None and size > total:
        raise ValidationError(path, f"{size} bytes in all is more than {total}")


def validate_sizes(spec: types_pb2.TaskSpec) -> None:
    """Size limits of a wire spec (documented in :mod:`coordinator.profiler.taskspec`).

    Each field's own limit is checked before the limit on the whole serialized spec, so a spec that
    is too large because of one field (a huge argument, a huge environment) is refused naming it.

    :raises ValidationError: naming the field that is too large.
    """
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
    for field in ("avoid_nodes", "only_nodes"):
        nodes = getattr(spec.constraints, field)
        if len(nodes) > MAX_AVOID_NODES:
            raise ValidationError(f"spec.constraints.{field}", f"{len(nodes)} nodes is more than {MAX_AVOID_NODES}")
        for i, node_id in enumerate(nodes):
            if not 0 < _utf8(node_id) <= MAX_LABEL_KEY_BYTES:
                raise ValidationError(f"spec.constraints.{field}[{i}]", "not a node id")
    size = spec.ByteSize()
    if size > MAX_SPEC_BYTES:
        raise ValidationError("spec", f"{size} bytes serialized is more than {MAX_SPEC_BYTES}")
    if spec.restart_policy not in types_pb2.RestartPolicy.values():
        raise ValidationError("spec.restart_policy", f"unknown value {spec.restart_policy}")
    if spec.max_restarts > MAX_RESTARTS:
        raise ValidationError("spec.max_restarts", f"{spec.max_restarts} is more than {MAX_RESTARTS}")


def validate_spec(spec: types_pb2.TaskSpec | TaskSpecData, max_gpus_per_node: int, *,
                  now: float | None = None) -> TaskSpecData:
    """Check a task spec before it is queued; the first problem found is raised.

    Refused: anything over the size limits (:func:`validate_sizes`: name, argv, env, labels,
    the whole serialized spec), an unknown restart policy, ``max_restarts`` above the bound;
    an unknown kind; an empty ``argv`` (or an empty program name); a NUL byte in ``argv`` or
    ``env`` and an ``env`` key that is not a variable name (:func:`validate_argv_env`); negative, NaN or
    infinite numbers; zero where a positive value is needed (gang size, replicas, the size of a
    named model when no explicit demand is given, an all-zero demand); absurdly large values (more than 4096
    GPUs, more than 1 PiB of any memory or disk, more than 100,000 B parameters); GPU memory
    without GPUs; a fractional GPU above 1 or without ``allow_gpu_sharing``; more GPUs per node
    than any node has; an unknown precision; negative QoS targets or grace period; and the QoS
    fields :func:`~coordinator.profiler.qos_spec.validate_qos_spec` refuses (a deadline that has passed,
    a bad checkpoint signal or metrics endpoint); a negative priority; a service part that
    :func:`validate_service` refuses; a launcher other than ``torchrun``; an elastic range
    :func:`~coordinator.elastic.spec.validate_elastic` refuses; an image reference, mount, working
    directory or ``/dev/shm`` size :func:`common.oci.validate_container` refuses (their syntax; the allowed host
    roots are checked by the Admin API, which knows the cluster's); an array, dependency or start time
    :func:`~coordinator.profiler.workflow_spec.validate_workflow` refuses.

    :param spec: the spec, wire or plain form.
    :param max_gpus_per_node: the most GPUs any known node has; 0 or less skips that check (no node
        has registered yet).
    :returns: the plain form of the spec (:func:`~coordinator.profiler.taskspec.spec_data`), for the profiler.
    :raises ValidationError: naming the dotted field (``spec.demand.gpus``) and the problem.
    """
    if isinstance(spec, types_pb2.TaskSpec):
        validate_sizes(spec)
    data = spec_data(spec)
    if not data.argv or not data.argv[0].strip():
        raise ValidationError("spec.argv", "must name the program to run")
    validate_argv_env(data.argv, data.env)
    _validate_shape(data, max_gpus_per_node)
    _validate_model(data)
    if data.demand is not None:
        _validate_demand(data.demand, data.allow_gpu_sharing, max_gpus_per_node)
    for name in ("deadline_unix_s", "max_latency_ms", "min_tokens_per_s"):
        _number(f"spec.qos.{name}", getattr(data.qos, name), high=1e15)
    if isinstance(spec, types_pb2.TaskSpec):
        _number("spec.stop_grace_s", spec.stop_grace_s, high=86_400.0)
        _number("spec.time_limit_s", spec.time_limit_s, high=MAX_TIME_LIMIT_S)
        _number("spec.min_runtime_s", spec.min_runtime_s, high=MAX_TIME_LIMIT_S)
        validate_qos_spec(spec, time.time() if now is None else now)
        if spec.run_as_user and not _USER_RE.fullmatch(spec.run_as_user):
            raise ValidationError("spec.run_as_user", f"invalid user name {spec.run_as_user[:64]!r}")
        if spec.launcher not in ("", "torchrun"):
            raise ValidationError("spec.launcher", f"unknown launcher {spec.launcher[:64]!r} (torchrun, or none)")
        if spec.queue and not _QUEUE_RE.fullmatch(spec.queue):
            raise ValidationError("spec.queue", f"invalid queue name {spec.queue[:64]!r} ([a-z0-9][a-z0-9-]{{0,62}})")
        if spec.HasField("service"):
            validate_service(spec)
        validate_elastic(spec, max_gpus_per_node)
        validate_container(spec.image, spec.mounts, spec.workdir, spec.shm_bytes)
        validate_workflow(spec, now)
        if spec.pty:
            validate_pty(spec)
    return data


def validate_pty(spec: types_pb2.TaskSpec) -> None:
    """A task on a terminal (``gptrmctl run --pty``, docs/interactive.md) is one process on one node whose
    session ends it: no gang, no service, no elastic resizes, no restarts, no array.

    :raises ValidationError: on ``spec.pty`` naming what it cannot go with."""
    if spec.nodes > 1:
        raise ValidationError("spec.pty", "a terminal is one node's: not with nodes > 1")
    if spec.HasField("service") or spec.HasField("elastic") or spec.HasField("array") or spec.image:
        raise ValidationError("spec.pty", "not for a service, an elastic task, an array or a container image")
    if spec.restart_policy not in (types_pb2.RESTART_POLICY_UNSPECIFIED, types_pb2.RESTART_POLICY_NEVER):
        raise ValidationError("spec.pty", "a terminal session is not restarted: restart_policy must be never")


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
