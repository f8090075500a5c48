"""Hypothesis strategies for any protobuf message, from its descriptor.

Every field may be left unset or get a hostile value of its type: strings with control
characters, bidirectional overrides and up to a few KiB (or one oversized string), numbers at
and beyond their limits (NaN, ±inf, 5e-324, 1e308, negative), unknown enum numbers, repeated
fields and maps with many entries, nested messages down to ``depth``. ``overrides`` pins a field
(by its full name, e.g. ``"gptrm.v1.TaskSpec.argv"``) to a strategy of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from hypothesis import strategies as st

__all__ = ["HOSTILE_TEXT", "message"]

_F = FieldDescriptor
HOSTILE_TEXT = st.one_of(
    st.text(max_size=40),
    st.text(alphabet=st.sampled_from("ab\x1b\n\r\t\x00\u202e\u2028/.-_:\\\"'$` "), max_size=60),
    st.sampled_from(["", ".", "..", "../etc", "a/b", "x" * 300, "é" * 100, "\U0001F600" * 10]),
    st.integers(1000, 40_000).map(lambda n: "n" * n),
)
_FLOAT = st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                   st.sampled_from([0.0, -0.0, 5e-324, 1e-300, 0.5, 1.0, 8.0, 1e308, -1.0]))
_INTS = {
    _F.TYPE_INT32: st.integers(-(2**31), 2**31 - 1), _F.TYPE_SINT32: st.integers(-(2**31), 2**31 - 1),
    _F.TYPE_SFIXED32: st.integers(-(2**31), 2**31 - 1), _F.TYPE_UINT32: st.integers(0, 2**32 - 1),
    _F.TYPE_FIXED32: st.integers(0, 2**32 - 1), _F.TYPE_INT64: st.integers(-(2**63), 2**63 - 1),
    _F.TYPE_SINT64: st.integers(-(2**63), 2**63 - 1), _F.TYPE_SFIXED64: st.integers(-(2**63), 2**63 - 1),
    _F.TYPE_UINT64: st.integers(0, 2**64 - 1), _F.TYPE_FIXED64: st.integers(0, 2**64 - 1),
}


def _repeated(field: FieldDescriptor) -> bool:
    flag = getattr(field, "is_repeated", None)
    return bool(flag) if flag is not None else field.label == _F.LABEL_REPEATED


def _small_ints(strategy: st.SearchStrategy[int], field: FieldDescriptor) -> st.SearchStrategy[int]:
    lo, hi = (0, 2**32 - 1) if field.type in (_F.TYPE_UINT32, _F.TYPE_FIXED32, _F.TYPE_UINT64,
                                              _F.TYPE_FIXED64) else (-1, 2**31 - 1)
    return st.one_of(st.integers(max(lo, -3), 16), st.sampled_from([lo, hi]), strategy)


def _scalar(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    if field.type in (_F.TYPE_DOUBLE, _F.TYPE_FLOAT):
        return _FLOAT.filter(lambda v: field.type == _F.TYPE_DOUBLE or v != v or abs(v) < 3e38 or v in (
            float("inf"), float("-inf")))
    if field.type in _INTS:
        return _small_ints(_INTS[field.type], field)
    if field.type == _F.TYPE_BOOL:
        return st.booleans()
    if field.type == _F.TYPE_STRING:
        return HOSTILE_TEXT
    if field.type == _F.TYPE_BYTES:
        return st.binary(max_size=256)
    if field.type == _F.TYPE_ENUM:
        return st.one_of(st.sampled_from([v.number for v in field.enum_type.values]), st.integers(-5, 300))
    raise TypeError(f"no strategy for field type {field.type} ({field.full_name})")


def message(descriptor: Descriptor, cls: type[Message], *, depth: int = 3,
            overrides: Mapping[str, st.SearchStrategy[Any]] | None = None) -> st.SearchStrategy[Message]:
    """Messages of type ``cls`` with any subset of fields set to hostile values."""
    overrides = dict(overrides or {})

    @st.composite
    def build(draw: st.DrawFn) -> Message:
        msg = cls()
        fields = list(descriptor.fields)
        chosen = draw(st.lists(st.sampled_from(fields), unique_by=lambda f: f.number, max_size=len(fields))) \
            if fields else []
        for f in chosen:
            _set(draw, msg, f, depth, overrides)
        return msg

    return build()


def _value(draw: st.DrawFn, field: FieldDescriptor, depth: int, overrides: Mapping[str, Any]) -> Any:
    if field.full_name in overrides:
        return draw(overrides[field.full_name])
    return draw(_scalar(field))


def _set(draw: st.DrawFn, msg: Message, field: FieldDescriptor, depth: int,
         overrides: Mapping[str, st.SearchStrategy[Any]]) -> None:
    if field.full_name in overrides and field.type != _F.TYPE_MESSAGE:
        value = draw(overrides[field.full_name])
        if _repeated(field):
            getattr(msg, field.name).extend(value)
        else:
            setattr(msg, field.name, value)
        return
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        key_f, val_f = field.message_type.fields_by_name["key"], field.message_type.fields_by_name["value"]
        entries = draw(st.dictionaries(_scalar(key_f), _scalar(val_f) if val_f.message_type is None else st.none(),
                                       max_size=draw(st.sampled_from([3, 3, 3, 200]))))
        target = getattr(msg, field.name)
        for k, v in entries.items():
            if v is None:
                target[k]   # a default message value
            else:
                target[k] = v
        return
    if field.type == _F.TYPE_MESSAGE:
        if depth <= 0:
            return
        sub_cls = type(getattr(msg, field.name)) if not _repeated(field) else None
        if _repeated(field):
            container = getattr(msg, field.name)
            for _ in range(draw(st.integers(0, 3))):
                item = container.add()
                item.CopyFrom(draw(message(field.message_type, type(item), depth=depth - 1, overrides=overrides)))
        else:
            getattr(msg, field.name).CopyFrom(draw(message(field.message_type, sub_cls, depth=depth - 1,
                                                           overrides=overrides)))
        return
    if _repeated(field):
        getattr(msg, field.name).extend(draw(st.lists(_scalar(field), max_size=draw(st.sampled_from([3, 3, 500])))))
    else:
        setattr(msg, field.name, _value(draw, field, depth, overrides))
