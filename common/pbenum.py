"""A number as a value of a generated protobuf enum type, for the type checker.

A protobuf enum field takes any int at run time, and the domain enums of :mod:`common.types` carry the
same numbers as their ``gptrm.v1`` counterparts. The generated stubs, though, type each enum field with
the enum's own class (an ``int`` subclass that no value is ever an instance of at run time), so a plain
int or an ``IntEnum`` member does not type-check there. :func:`pb_enum` is that conversion; at run time
it is ``int(value)``.
"""

from __future__ import annotations

from typing import TypeVar, cast

__all__ = ["pb_enum"]

E = TypeVar("E", bound=int)


def pb_enum(enum_type: type[E], value: int) -> E:
    """``value`` as a value of the generated enum ``enum_type`` (e.g. ``types_pb2.TaskState``)."""
    # The number is one of the enum's values (the domain enums mirror the proto enums), and at run time
    # every generated enum value is a plain int.
    return cast(E, int(value))
