"""gptrmctl's one JSON dialect, and the JSON Schemas that pin it down.

Every ``-o json`` document follows the same rules, whatever the command:

* keys are snake_case (the proto field names, or the document's own keys);
* numbers are JSON numbers, 64-bit integers included (never strings); non-finite floats are null;
* every documented field is present, zero and empty values included; a field that can be
  *unknown* (a proto3 ``optional`` reading such as ``util_gpu`` of a GPU that did not answer)
  is ``null`` then;
* enum values are lowercase words joined by ``-`` with the type prefix removed, the same
  spelling everywhere (``TASK_KIND_FINE_TUNING`` → ``fine-tuning``, ``TASK_STATE_RUNNING`` →
  ``running``, ``TASK_KIND_UNSPECIFIED`` → ``unspecified``).

:func:`proto_dict` converts any message by these rules; :func:`proto_schemas` derives the
matching JSON Schema ``$defs`` from the same descriptors. The committed
``schemas/proto.json`` is that output (``python -m coordinator.ctl.jsondoc`` rewrites it),
and the hand-written ``schemas/<document>.json`` refer to it.
"""

from __future__ import annotations

import json
import math
import re
import sys
from importlib import resources
from typing import TYPE_CHECKING, Any, TypeAlias

from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor
from google.protobuf.message import Message

from common.pb.gptrm.v1 import admin_pb2, types_pb2

if TYPE_CHECKING:
    from google._upb import _message as _upb

    # Descriptors come from the C (upb) or the pure-Python implementation, which the stubs type apart.
    MessageDesc: TypeAlias = Descriptor | _upb.Descriptor
    FieldDesc: TypeAlias = FieldDescriptor | _upb.FieldDescriptor

__all__ = [
    "SCHEMA_DOCUMENTS",
    "enum_label",
    "enum_labels",
    "load_schemas",
    "proto_dict",
    "proto_schemas",
]

SCHEMA_DOCUMENTS = ("status", "node", "nodes", "task", "tasks", "policy", "event", "log_chunk", "service", "usage",
                    "queues", "images", "image_pull", "reservations", "cancel")
"""The hand-written schema files (``schemas/<name>.json``), one per kind of document."""

_INTS = {FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT32,
         FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_SINT64,
         FieldDescriptor.TYPE_FIXED32, FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED32,
         FieldDescriptor.TYPE_SFIXED64}
_UNSIGNED = {FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED32,
             FieldDescriptor.TYPE_FIXED64}
_FLOATS = {FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT}
_HIDDEN = {"has_demand", "has_exit_code", "has_latest"}
"""Presence flags: the JSON says the same with ``null``, so they are left out."""

# Messages whose schemas gptrmctl's documents use (their dependencies are added as found).
_ROOTS: tuple[MessageDesc, ...] = (
    types_pb2.TaskSpec.DESCRIPTOR, types_pb2.ResourceVector.DESCRIPTOR, types_pb2.NodeAllocation.DESCRIPTOR,
    types_pb2.TaskStateChange.DESCRIPTOR, types_pb2.GpuInfo.DESCRIPTOR, types_pb2.GpuSample.DESCRIPTOR,
    types_pb2.HostSample.DESCRIPTOR, types_pb2.TaskQos.DESCRIPTOR, admin_pb2.ClusterObjectives.DESCRIPTOR,
    types_pb2.ScaleDecision.DESCRIPTOR, admin_pb2.TelemetryRateStatus.DESCRIPTOR,
    types_pb2.NodeHealthCheck.DESCRIPTOR, types_pb2.GpuFence.DESCRIPTOR, types_pb2.GpuHealthEvent.DESCRIPTOR,
    types_pb2.AppXid.DESCRIPTOR,
)


def _prefix(enum: EnumDescriptor) -> str:
    """``TaskKind`` → ``TASK_KIND_``."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", enum.name).upper() + "_"


def enum_label(enum: EnumDescriptor | Any, value: int) -> str:
    """The JSON (and table) spelling of an enum value: ``fine-tuning``, ``not-ready``, ``running``.

    :param enum: the enum's descriptor, or its generated wrapper (``types_pb2.TaskKind``).
    :param value: the number; one the enum does not know is written as the number in decimal.
    """
    descriptor: EnumDescriptor = getattr(enum, "DESCRIPTOR", enum)
    found = descriptor.values_by_number.get(value)
    if found is None:
        return str(value)
    return found.name.removeprefix(_prefix(descriptor)).lower().replace("_", "-")


def enum_labels(enum: EnumDescriptor | Any) -> list[str]:
    """Every label of an enum, in number order."""
    descriptor: EnumDescriptor = getattr(enum, "DESCRIPTOR", enum)
    return [enum_label(descriptor, v.number) for v in descriptor.values]


def _scalar(field: FieldDesc, value: Any) -> Any:
    if field.type == FieldDescriptor.TYPE_ENUM:
        return enum_label(field.enum_type, value)
    if field.type in _FLOATS:
        return value if math.isfinite(value) else None
    if field.type == FieldDescriptor.TYPE_BYTES:
        return value.hex()
    return value


def _nullable(field: FieldDesc) -> bool:
    """A singular scalar with explicit presence (proto3 ``optional``): null when unset."""
    return field.message_type is None and not _repeated(field) and field.has_presence


def _repeated(field: FieldDesc) -> bool:
    return field.is_repeated


def _flagged(field: FieldDesc) -> bool:
    """A message field with a ``has_<name>`` presence flag beside it (``TaskSpec.demand``): null when unset."""
    container = field.containing_type
    return field.message_type is not None and container is not None and f"has_{field.name}" in container.fields_by_name


def _is_map(field: FieldDesc) -> bool:
    return field.message_type is not None and field.message_type.GetOptions().map_entry


def _map_value(field: FieldDesc) -> FieldDesc:
    """The ``value`` field of a map field's entry message."""
    if field.message_type is None:
        raise ValueError(f"{field.full_name} is not a map field")
    return field.message_type.fields_by_name["value"]


def proto_dict(msg: Message) -> dict[str, Any]:
    """``msg`` in gptrmctl's JSON dialect (see the module docstring).

    Example: ``proto_dict(types_pb2.ResourceVector(gpus=1))`` →
    ``{"gpus": 1.0, "gpu_mem_bytes": 0, "cpu_cores": 0.0, "mem_bytes": 0, "disk_bytes": 0}``.
    """
    out: dict[str, Any] = {}
    for field in msg.DESCRIPTOR.fields:
        if field.name in _HIDDEN:
            continue
        value = getattr(msg, field.name)
        if _is_map(field):
            vfield = _map_value(field)
            out[field.name] = {
                k: proto_dict(v) if vfield.message_type is not None else _scalar(vfield, v) for k, v in value.items()
            }
        elif _repeated(field):
            out[field.name] = [proto_dict(v) if field.message_type is not None else _scalar(field, v) for v in value]
        elif field.message_type is not None:
            unset = _flagged(field) and not getattr(msg, f"has_{field.name}")
            out[field.name] = None if unset else proto_dict(value)
        elif _nullable(field) and not msg.HasField(field.name):
            out[field.name] = None
        else:
            out[field.name] = _scalar(field, value)
    return out


def _scalar_schema(field: FieldDesc) -> dict[str, Any]:
    if field.type == FieldDescriptor.TYPE_ENUM:
        return {"enum": enum_labels(field.enum_type)}
    if field.type in _INTS:
        return {"type": "integer", "minimum": 0} if field.type in _UNSIGNED else {"type": "integer"}
    if field.type in _FLOATS:
        return {"type": ["number", "null"]}
    if field.type == FieldDescriptor.TYPE_BOOL:
        return {"type": "boolean"}
    return {"type": "string"}


def _field_schema(field: FieldDesc, defs: dict[str, Any]) -> dict[str, Any]:
    if _is_map(field):
        vfield = _map_value(field)
        return {"type": "object", "additionalProperties": _field_schema(vfield, defs)}
    if field.message_type is not None:
        _add(field.message_type, defs)
        item: dict[str, Any] = {"$ref": f"#/$defs/{field.message_type.name}"}
    else:
        item = _scalar_schema(field)
    if _repeated(field):
        return {"type": "array", "items": item}
    if _flagged(field):
        return {"anyOf": [item, {"type": "null"}]}
    if _nullable(field):
        if "type" in item:
            types = item["type"] if isinstance(item["type"], list) else [item["type"]]
            return {**item, "type": [*dict.fromkeys([*types, "null"])]}
        return {"anyOf": [item, {"type": "null"}]}
    return item


def _add(descriptor: MessageDesc, defs: dict[str, Any]) -> None:
    if descriptor.name in defs:
        return
    defs[descriptor.name] = {}  # placeholder first: messages may refer to each other
    fields = [f for f in descriptor.fields if f.name not in _HIDDEN]
    defs[descriptor.name] = {
        "type": "object",
        "properties": {f.name: _field_schema(f, defs) for f in fields},
        "required": [f.name for f in fields],
        "additionalProperties": False,
    }


def proto_schemas() -> dict[str, Any]:
    """The JSON Schema document with a ``$defs`` entry per message gptrmctl prints (``schemas/proto.json``)."""
    defs: dict[str, Any] = {}
    for root in _ROOTS:
        _add(root, defs)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "proto.json",
        "title": "gptrm protobuf messages as gptrmctl prints them (generated by python -m coordinator.ctl.jsondoc)",
        "$defs": dict(sorted(defs.items())),
    }


def load_schemas() -> dict[str, dict[str, Any]]:
    """Every shipped schema by file name (``node.json``, ``proto.json``, …), read from the package."""
    folder = resources.files("coordinator.ctl") / "schemas"
    return {name + ".json": json.loads((folder / f"{name}.json").read_text())
            for name in (*SCHEMA_DOCUMENTS, "proto")}


def main() -> int:
    """Rewrite ``schemas/proto.json`` from the descriptors."""
    path = resources.files("coordinator.ctl") / "schemas" / "proto.json"
    with resources.as_file(path) as p:
        p.write_text(json.dumps(proto_schemas(), indent=2) + "\n")
        print(f"wrote {p}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
