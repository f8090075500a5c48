"""Task specs at the edge: protobuf ↔ plain data, YAML/JSON mappings → protobuf, validation.

Re-exported by :mod:`coordinator.profiler.profiler`; this module holds the parts that touch
``types_pb2`` so the profiler's arithmetic works on :class:`~coordinator.domain.TaskSpecData`.

On the wire ``demand.gpu_mem_bytes`` is **per GPU**; in :class:`~coordinator.domain.Resources` it
is the node total (per GPU × the GPUs the task uses on the node, one for a shared fraction).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeAlias

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from common.errors import ValidationError
from common.pb.gptrm.v1 import types_pb2
from common.pbenum import pb_enum
from common.types import TaskKind
from coordinator.domain import ModelSpecData, QosData, Resources, TaskSpecData
from coordinator.profiler.qos_spec import parse_deadline, parse_time_limit
from coordinator.profiler.workflow_spec import parse_after, parse_array, parse_begin

if TYPE_CHECKING:
    from google._upb import _message as _upb

    # A field descriptor of the C (upb) or the pure-Python implementation, which the stubs type apart.
    FieldDesc: TypeAlias = FieldDescriptor | _upb.FieldDescriptor

__all__ = ["PRECISIONS", "gpus_used", "spec_data", "spec_from_mapping", "spec_to_proto"]

PRECISIONS = ("fp32", "bf16", "fp16", "fp8", "int8", "int4")
"""Model precisions the profiler knows."""

MAX_GPUS = 4096
MAX_BYTES = 1024**5  # 1 PiB
MAX_CPU_CORES = 65_536
MAX_PARAMS_BILLIONS = 100_000.0
MAX_CONTEXT = 10_000_000
MAX_BATCH = 1_000_000
MAX_NODES = 4096
MIN_GPU_SHARE = 0.01
"""Smallest fraction of a GPU a task may ask for."""
MIN_CPU_CORES = 0.01
"""Smallest CPU demand a task may give (0 for none): a hundredth of a core, what the kernel can still share out."""
MIN_BYTES = 1024**2
"""Smallest memory, GPU memory or disk demand a task may give (0 for none): one MiB."""
MAX_RESTARTS = 1000
"""Most restarts ``max_restarts`` may allow (each restart backs off, see ``coordinator.qos.restart``)."""
MAX_REPLICAS = 64
"""The most replicas one service may ask for."""

# Size limits, checked at submit. The whole serialized spec is bounded by MAX_SPEC_BYTES so that
# a task record (spec, bounded history, reasons) and every later etcd transaction carrying it
# (placement with its allocation and node reservations, cancel, restart) stays far below
# etcd's 1.5 MiB request limit, and parsing one request never stalls the event loop.
MAX_NAME_CHARS = 253
MAX_ARGV_ITEMS = 1024
MAX_ARG_BYTES = 32 * 1024
MAX_ARGV_BYTES = 128 * 1024
MAX_ENV_ITEMS = 256
MAX_ENV_KEY_BYTES = 256
MAX_ENV_VALUE_BYTES = 32 * 1024
MAX_ENV_BYTES = 128 * 1024
MAX_LABELS = 64
MAX_AVOID_NODES = 256   # constraints.avoid_nodes entries (a service's replicas on other nodes)
MAX_LABEL_KEY_BYTES = 253
MAX_LABEL_VALUE_BYTES = 1024
MAX_SPEC_BYTES = 256 * 1024
_RESTART = {"never": 1, "on-failure": 2, "always": 3}
_UNITS = {"": 1, "b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4, "pb": 1000**5,
          "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4, "pib": 1024**5}  # fmt: skip
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def gpus_used(gpus: float) -> int:
    """How many physical GPUs a per-node GPU demand occupies (one for a shared fraction).

    :param gpus: the demand in GPUs.
    :returns: ``ceil(gpus)`` for positive demands, else 0.
    """
    return math.ceil(gpus) if gpus > 0 and math.isfinite(gpus) else 0


def _kind(value: int) -> TaskKind:
    """Wire enum value → :class:`TaskKind`."""
    try:
        return TaskKind(value)
    except ValueError:
        raise ValidationError(
            "spec.kind", f"unknown task kind {value} (expected training, fine-tuning or inference)"
        ) from None


def spec_data(spec: types_pb2.TaskSpec | TaskSpecData) -> TaskSpecData:
    """The plain form of a spec (``from_proto``); a :class:`TaskSpecData` is returned as is.

    :param spec: the wire spec.
    :returns: the plain spec.
    :raises ValidationError: on an unknown task kind.
    """
    if isinstance(spec, TaskSpecData):
        return spec
    m, d = spec.model, spec.demand
    demand = None
    if spec.has_demand:
        demand = Resources(d.gpus, d.gpu_mem_bytes * max(1, gpus_used(d.gpus)), d.cpu_cores, d.mem_bytes, d.disk_bytes)
    return TaskSpecData(
        name=spec.name,
        kind=_kind(spec.kind),
        model=ModelSpecData(
            m.name, m.params_billions, m.precision or "bf16", m.context_length, m.batch_size, m.layers, m.hidden_size
        ),
        demand=demand,
        replicas=max(1, spec.replicas),
        nodes=max(1, spec.nodes),
        gpus_per_node=spec.gpus_per_node,
        priority=spec.priority,
        qos=QosData(spec.qos.deadline_unix_s, spec.qos.max_latency_ms, spec.qos.min_tokens_per_s),
        argv=tuple(spec.argv),
        env=dict(spec.env),
        labels=dict(spec.labels),
        gpu_model=spec.constraints.gpu_model,
        node_selector=dict(spec.constraints.node_selector),
        allow_gpu_sharing=spec.allow_gpu_sharing,
        preemptible=spec.preemptible if spec.HasField("preemptible") else True,
        checkpoint_signal=spec.checkpoint_signal,
    )


def spec_to_proto(data: TaskSpecData) -> types_pb2.TaskSpec:
    """The wire form of a plain spec (``to_proto``).

    :param data: the plain spec.
    :returns: a new ``TaskSpec`` message.
    """
    m = data.model
    spec = types_pb2.TaskSpec(
        name=data.name, kind=pb_enum(types_pb2.TaskKind, data.kind), replicas=data.replicas, nodes=data.nodes,
        gpus_per_node=data.gpus_per_node, priority=data.priority, argv=list(data.argv), env=dict(data.env),
        labels=dict(data.labels), allow_gpu_sharing=data.allow_gpu_sharing,
        checkpoint_signal=data.checkpoint_signal,
        model=types_pb2.ModelSpec(
            name=m.name, params_billions=m.params_billions, precision=m.precision, context_length=m.context_length,
            batch_size=m.batch_size, layers=m.layers, hidden_size=m.hidden_size,
        ),
        qos=types_pb2.QosSpec(deadline_unix_s=data.qos.deadline_unix_s, max_latency_ms=data.qos.max_latency_ms,
                              min_tokens_per_s=data.qos.min_tokens_per_s),
        constraints=types_pb2.Constraints(gpu_model=data.gpu_model, node_selector=dict(data.node_selector)),
    )  # fmt: skip
    if not data.preemptible:
        spec.preemptible = False
    if data.demand is not None:
        d = data.demand
        per_gpu = d.gpu_mem_total_bytes // max(1, gpus_used(d.gpus))
        spec.demand.CopyFrom(types_pb2.ResourceVector(
            gpus=d.gpus, gpu_mem_bytes=per_gpu, cpu_cores=d.cpu_cores, mem_bytes=d.mem_bytes, disk_bytes=d.disk_bytes
        ))  # fmt: skip
        spec.has_demand = True
    return spec


# ---- YAML / JSON mappings -------------------------------------------------------------------


def _show(value: Any, limit: int = 64) -> str:
    """``value`` for an error message: its repr cut to ``limit`` characters, never an exception
    (a deeply nested list, an integer with thousands of digits)."""
    try:
        text = repr(value)
    except (RecursionError, ValueError):
        return f"a {type(value).__name__} too large to show"
    return text if len(text) <= limit else text[:limit] + "…"


def _text(value: str, path: str) -> str:
    """A string that protobuf can carry: UTF-8 without lone surrogates (what a non-UTF-8 command
    line or file name decodes to, or a JSON ``\\udcff`` escape)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        char = value[e.start]
        what = f"byte 0x{ord(char) - 0xDC00:02x}" if 0xDC80 <= ord(char) <= 0xDCFF else f"U+{ord(char):04X}"
        raise ValidationError(path, f"is not valid UTF-8 ({what} at character {e.start})") from None
    return value


def _size(value: Any, path: str) -> int:
    """A byte count: an integer, or a string such as ``"80GiB"`` / ``"1.5 TB"``."""
    if isinstance(value, str):
        match = _SIZE.match(value)
        if match is None or match.group(2).lower() not in _UNITS:
            raise ValidationError(path, f"not a size: {_show(value)} (e.g. 80GiB, 512MB, 1024)")
        number = float(match.group(1)) * _UNITS[match.group(2).lower()]
        if not math.isfinite(number):
            raise ValidationError(path, f"{_show(value)} is out of range")
        return int(number)
    return _integer(value, path)


def _integer(value: Any, path: str) -> int:
    """An integer (a float is accepted when it is whole)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValidationError(path, f"expected an integer, got {_show(value)}")
    if isinstance(value, float) and not value.is_integer():
        raise ValidationError(path, f"expected an integer, got {_show(value)}")
    return int(value)


def _enum(field: FieldDesc, value: Any, path: str) -> int:
    """An enum from its label (``fine-tuning``, ``on-failure``) or wire name."""
    if not isinstance(value, str):
        raise ValidationError(path, f"expected a name, got {_show(value)}")
    enum = field.enum_type
    if enum is None:
        raise ValueError(f"{field.full_name} is not an enum field")
    if enum.name == "TaskKind":
        try:
            return int(TaskKind.parse(value))
        except ValueError as e:
            raise ValidationError(path, str(e)) from None
    label = value.strip().lower().replace("_", "-")
    if enum.name == "RestartPolicy" and label in _RESTART:
        return _RESTART[label]
    names = {v.name.lower().replace("_", "-"): v.number for v in enum.values if v.number}
    if label not in names:
        raise ValidationError(path, f"unknown value {_show(value)}")
    return names[label]


def _scalar(field: FieldDesc, value: Any, path: str) -> Any:
    """One scalar value of a field, type-checked."""
    if field.type == FieldDescriptor.TYPE_STRING:
        if not isinstance(value, str):
            raise ValidationError(path, f"expected a string, got {_show(value)}")
        return _text(value, path)
    if field.type == FieldDescriptor.TYPE_BOOL:
        if not isinstance(value, bool):
            raise ValidationError(path, f"expected true or false, got {_show(value)}")
        return value
    if field.type == FieldDescriptor.TYPE_ENUM:
        return _enum(field, value, path)
    if field.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValidationError(path, f"expected a number, got {_show(value)}")
        try:
            return float(value)
        except OverflowError:
            raise ValidationError(path, f"{_show(value)} is out of range") from None
    number = _size(value, path) if field.name.endswith("_bytes") else _integer(value, path)
    unsigned = field.type in (FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_UINT64)
    bits = 64 if field.type in (FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_INT64) else 32
    low, high = (0, 2**bits - 1) if unsigned else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    if not low <= number <= high:
        raise ValidationError(path, f"{_show(number)} is out of range [{low}, {high}]")
    return number


def _fill(message: Message, mapping: Mapping[str, Any], path: str) -> None:
    """Copy a mapping into a message, rejecting unknown keys by their dotted path."""
    descriptor = message.DESCRIPTOR
    for key, value in mapping.items():
        field = descriptor.fields_by_name.get(key) if isinstance(key, str) else None
        where = f"{path}.{key if isinstance(key, str) else _show(key)}"
        if field is None:
            raise ValidationError(where, f"unknown field (known: {', '.join(sorted(descriptor.fields_by_name))})")
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            if not isinstance(value, Mapping):
                raise ValidationError(where, f"expected a mapping of strings, got {_show(value)}")
            target = getattr(message, key)
            for k, v in value.items():
                if not isinstance(k, str):
                    raise ValidationError(where, f"expected string keys, got {_show(k)}")
                entry = f"{where}.{_text(k, f'{where}: a key')}"
                if not isinstance(v, str | int | float) or isinstance(v, bool):
                    raise ValidationError(entry, f"expected a string value, got {_show(v)}")
                try:
                    text = v if isinstance(v, str) else str(v)
                except ValueError:   # an integer with more digits than Python converts
                    raise ValidationError(entry, f"{_show(v)} is out of range") from None
                target[k] = _text(text, entry)
        elif field.message_type is not None:
            if not isinstance(value, Mapping):
                raise ValidationError(where, f"expected a mapping, got {_show(value)}")
            _fill(getattr(message, key), value, where)
            if key == "demand" and isinstance(message, types_pb2.TaskSpec):   # the one message with a demand
                message.has_demand = True
        elif field.is_repeated:
            if not isinstance(value, list):
                raise ValidationError(where, f"expected a list, got {_show(value)}")
            getattr(message, key).extend(_scalar(field, v, f"{where}[{i}]") for i, v in enumerate(value))
        else:
            setattr(message, key, _scalar(field, value, where))


def _with_deadline(mapping: Mapping[str, Any], now: Callable[[], float]) -> Mapping[str, Any]:
    """``qos.deadline`` (an ISO 8601 time, a duration from now, or unix seconds) → ``qos.deadline_unix_s``."""
    qos = mapping.get("qos")
    if not isinstance(qos, Mapping) or "deadline" not in qos:
        return mapping
    if "deadline_unix_s" in qos:
        raise ValidationError("spec.qos.deadline", "give deadline or deadline_unix_s, not both")
    try:
        deadline = parse_deadline(qos["deadline"], now())
    except (ValueError, OverflowError, RecursionError):
        raise ValidationError("spec.qos.deadline", f"not a time or a duration: {_show(qos['deadline'])} "
                                                   "(e.g. 2025-06-01T18:00:00Z or 2h30m)") from None
    rest = {k: v for k, v in qos.items() if k != "deadline"}
    return {**mapping, "qos": {**rest, "deadline_unix_s": deadline}}


def _without_workflow(mapping: Mapping[str, Any], now: Callable[[], float]) -> tuple[Mapping[str, Any], list[Any]]:
    """``array`` as text (``"0-999%64"``) → its mapping, ``begin`` (an ISO time, ``+2h``) → ``begin_unix_s``; ``after``
    (a ``KIND:ID,...`` string or a list of them) is taken out, for :func:`spec_from_mapping` to add."""
    out = dict(mapping)
    if isinstance(out.get("array"), str | int) and not isinstance(out.get("array"), bool):
        a = parse_array(str(out["array"]))
        out["array"] = {"first": a.first, "last": a.last, "step": a.step, "max_running": a.max_running}
    if "begin" in out:
        if "begin_unix_s" in out:
            raise ValidationError("spec.begin", "give begin or begin_unix_s, not both")
        out["begin_unix_s"] = parse_begin(out.pop("begin"), now())
    after = out.pop("after", [])
    return out, after if isinstance(after, list) else [after]
_TIMES = (("time_limit", "time_limit_s"), ("min_runtime", "min_runtime_s"))
"""Keys a spec writes as a duration (``time_limit: 4h``) in place of their fields in seconds."""


def _with_times(mapping: Mapping[str, Any]) -> Mapping[str, Any]:
    """``time_limit`` and ``min_runtime`` (``4h``, ``90s``, ``1:30:00``; see ``parse_time_limit``) → their ``_s``
    fields."""
    out = dict(mapping)
    for key, field in _TIMES:
        if key not in out:
            continue
        if field in out:
            raise ValidationError(f"spec.{key}", f"give {key} or {field}, not both")
        try:
            out[field] = parse_time_limit(out.pop(key))
        except (ValueError, OverflowError):
            raise ValidationError(f"spec.{key}", f"not a duration: {_show(mapping[key])} "
                                                 "(e.g. 4h, 90s, 1:30:00)") from None
    return out


def spec_from_mapping(mapping: Mapping[str, Any], *, now: Callable[[], float] = time.time) -> types_pb2.TaskSpec:
    """Parse a YAML/JSON task spec (keys are the proto field names) into a ``TaskSpec``.

    Enums take their labels (``kind: fine-tuning``, ``restart_policy: on-failure``); ``*_bytes``
    fields also take sizes such as ``"80GiB"``; giving ``demand`` sets ``has_demand``;
    ``qos.deadline`` takes an ISO 8601 time or a duration from now (``2h30m``) in place of
    ``qos.deadline_unix_s``; ``array`` takes ``FIRST-LAST[:STEP][%MAX]``, ``begin`` a time or ``+DURATION``,
    ``after`` a list of ``KIND:ID[,ID...]`` (``docs/workflows.md``); ``time_limit`` and ``min_runtime`` take a
    duration (``4h``, ``1:30:00``) in place of ``time_limit_s`` and ``min_runtime_s``. Only the shape and types are
    checked here; :func:`validate_spec` checks the values.

    Example::

        spec = spec_from_mapping(yaml.safe_load(open("job.yaml")))

    :param mapping: the parsed document.
    :param now: wall clock (unix seconds) a deadline duration counts from.
    :returns: the spec.
    :raises ValidationError: naming the dotted path of an unknown key or a mistyped value.
    """
    if not isinstance(mapping, Mapping):
        raise ValidationError("spec", f"expected a mapping, got {type(mapping).__name__}")
    spec = types_pb2.TaskSpec()
    rest, after = _without_workflow(mapping, now)
    _fill(spec, _with_times(_with_deadline(rest, now)), "spec")
    for i, dep in enumerate(after):
        if not isinstance(dep, str):
            raise ValidationError(f"spec.after[{i}]", f"expected KIND:ID[,ID...], got {_show(dep)}")
        spec.after.append(parse_after(dep))
    return spec
