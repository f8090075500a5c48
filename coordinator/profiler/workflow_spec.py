"""The workflow parts of a task spec: arrays, dependencies and start times (``docs/workflows.md``).

Parsing helpers used by ``gptrmctl`` and the YAML/JSON spec parser, and the checks the coordinator
runs at submit. The leader's rules (what holds a task back, what ends it) are in
``coordinator/scheduler/workflow.py``; the array element ids are made here, once.

Example::

    array = parse_array("0-999:2%64")              # ArraySpec(first=0, last=999, step=2, max_running=64)
    deps = parse_after("ok:t-1a2b,t-3c4d")         # [Dependency(kind=OK, ids=["t-1a2b", "t-3c4d"])]
    begin = parse_begin("+2h", now=time.time())     # unix seconds
"""

from __future__ import annotations

import math
import re
import time
import uuid
from collections.abc import Sequence

from common.errors import ValidationError
from common.pb.gptrm.v1 import types_pb2
from coordinator.profiler.qos_spec import parse_deadline

__all__ = [
    "ARRAY_MAX_ELEMENTS",
    "ARRAY_PREFIX",
    "DEPENDENCY_KINDS",
    "MAX_DEPENDENCIES",
    "array_indices",
    "array_ref",
    "dependency_targets",
    "element_id",
    "new_array_id",
    "parse_after",
    "parse_array",
    "parse_begin",
    "validate_workflow",
]

ARRAY_MAX_ELEMENTS = 100_000
"""The most elements one array may have (Slurm's MaxArraySize defaults to 1001; ours is a documented cap)."""
MAX_DEPENDENCIES = 1_000
"""The most targets one task may wait for (task and array ids together)."""
ARRAY_PREFIX = "a-"
"""Array ids are ``a-`` and 12 hex digits; element ``i`` of array ``A`` is task ``A_i`` (Slurm's ``JOBID_INDEX``)."""
_MAX_BEGIN_AHEAD_S = 10 * 365 * 86400.0
_ARRAY = re.compile(r"^(\d+)(?:-(\d+))?(?::(\d+))?(?:%(\d+))?$")
_ELEMENT = re.compile(r"^(a-[0-9a-f]+)[:_](\d+)$")

DEPENDENCY_KINDS = {"ok": types_pb2.DEPENDENCY_KIND_OK, "notok": types_pb2.DEPENDENCY_KIND_NOTOK,
                    "any": types_pb2.DEPENDENCY_KIND_ANY}
"""``--after KIND:ID`` kinds (Slurm's afterok, afternotok, afterany)."""


def new_array_id() -> str:
    """A fresh array id."""
    return f"{ARRAY_PREFIX}{uuid.uuid4().hex[:12]}"


def element_id(array_id: str, index: int) -> str:
    """The task id of element ``index`` of ``array_id``."""
    return f"{array_id}_{index}"


def array_ref(text: str) -> str:
    """``ARRAY:INDEX`` (or ``ARRAY_INDEX``) → the element's task id; anything else unchanged."""
    match = _ELEMENT.match(text.strip())
    return element_id(match.group(1), int(match.group(2))) if match else text


def is_array_id(ref: str) -> bool:
    """Whether ``ref`` names a whole array (``a-...``), not one of its elements (``a-...:INDEX``) or a task."""
    return ref.startswith(ARRAY_PREFIX) and array_ref(ref) == ref


def array_indices(array: types_pb2.ArraySpec) -> range:
    """The indices an array spec names, in order."""
    return range(array.first, array.last + 1, array.step or 1)


def parse_array(text: str) -> types_pb2.ArraySpec:
    """``FIRST-LAST[:STEP][%MAX_RUNNING]`` (or one index ``N``) → an ``ArraySpec``; the values are checked
    by :func:`validate_workflow`.

    :raises ValidationError: on ``spec.array`` when the text has another shape.
    """
    match = _ARRAY.match(text.strip()) if isinstance(text, str) else None
    if match is None:
        raise ValidationError("spec.array", f"expected FIRST-LAST[:STEP][%MAX_RUNNING] (e.g. 0-999%64), got "
                                            f"{str(text)[:64]!r}")
    first, last, step, most = match.groups()
    values = [int(first), int(last if last is not None else first), int(step or 1), int(most or 0)]
    if any(v >= 2**32 for v in values):
        raise ValidationError("spec.array", f"{text[:64]!r}: numbers must be below 2^32")
    return types_pb2.ArraySpec(first=values[0], last=values[1], step=values[2], max_running=values[3])


def parse_after(text: str) -> types_pb2.Dependency:
    """``KIND:ID[,ID...]`` (KIND ok, notok or any; an ID is a task, an array, or ``ARRAY:INDEX``) → a ``Dependency``.

    :raises ValidationError: on ``spec.after`` for an unknown kind or no ids.
    """
    kind, sep, ids = text.partition(":") if isinstance(text, str) else ("", "", "")
    if not sep or kind.strip().lower() not in DEPENDENCY_KINDS:
        raise ValidationError("spec.after", f"expected KIND:ID[,ID...] with KIND one of "
                                            f"{', '.join(DEPENDENCY_KINDS)}, got {str(text)[:64]!r}")
    names = [array_ref(i.strip()) for i in ids.split(",") if i.strip()]   # ARRAY:INDEX names one element
    if not names:
        raise ValidationError("spec.after", f"{text[:64]!r} names no task or array")
    return types_pb2.Dependency(kind=DEPENDENCY_KINDS[kind.strip().lower()], ids=names)


def parse_begin(value: str | float, now: float) -> float:
    """A start time as unix seconds: an ISO 8601 time (local without an offset), ``+DURATION`` or ``DURATION``
    from ``now`` (``+2h``, ``+5s``), or unix seconds.

    :raises ValidationError: on ``spec.begin`` when it is neither.
    """
    text = value.strip().removeprefix("+") if isinstance(value, str) else value
    try:
        return parse_deadline(text, now)
    except (ValueError, OverflowError):
        raise ValidationError("spec.begin", f"not a time or a duration: {str(value)[:64]!r} "
                                            "(e.g. 2026-06-01T18:00:00Z or +2h)") from None


def validate_workflow(spec: types_pb2.TaskSpec, now: float | None = None) -> None:
    """Check the workflow fields of a spec at submit (their shape; whether the targets exist is the task
    table's check, which knows the tasks); the first problem found is raised.

    Refused: an array whose last index is below its first, with more than :data:`ARRAY_MAX_ELEMENTS`
    elements, or on a service; a dependency of no known kind, without ids, with a malformed id, or more than
    :data:`MAX_DEPENDENCIES` targets; a start time that is not finite or more than ten years ahead.

    :raises ValidationError: naming the field (``spec.array.last``, ``spec.after[1].kind``, ``spec.begin_unix_s``).
    """
    if spec.HasField("array"):
        a = spec.array
        if a.last < a.first:
            raise ValidationError("spec.array.last", f"{a.last} is below the first index {a.first}")
        count = len(array_indices(a))
        if count > ARRAY_MAX_ELEMENTS:
            raise ValidationError("spec.array", f"{count} elements; at most {ARRAY_MAX_ELEMENTS} in one array")
        if spec.HasField("service"):
            raise ValidationError("spec.array", "a service cannot be an array")
    targets = 0
    for i, dep in enumerate(spec.after):
        if dep.kind not in DEPENDENCY_KINDS.values():
            raise ValidationError(f"spec.after[{i}].kind", f"unknown dependency kind {dep.kind} "
                                                          f"(one of {', '.join(DEPENDENCY_KINDS)})")
        if not dep.ids:
            raise ValidationError(f"spec.after[{i}].ids", "names no task or array")
        for target in dep.ids:
            if not target or len(target) > 253 or any(c.isspace() or c in "/," for c in target):
                raise ValidationError(f"spec.after[{i}].ids", f"invalid id {target[:64]!r}")
        targets += len(dep.ids)
    if targets > MAX_DEPENDENCIES:
        raise ValidationError("spec.after", f"{targets} targets; at most {MAX_DEPENDENCIES}")
    if spec.after and spec.HasField("service"):
        raise ValidationError("spec.after", "a service cannot wait for other tasks")
    begin = spec.begin_unix_s
    if not math.isfinite(begin) or begin < 0:
        raise ValidationError("spec.begin_unix_s", f"must be a time in unix seconds, got {begin}")
    if begin > (time.time() if now is None else now) + _MAX_BEGIN_AHEAD_S:
        raise ValidationError("spec.begin_unix_s", "is more than ten years ahead")


def dependency_targets(deps: Sequence[types_pb2.Dependency]) -> list[str]:
    """Every id the dependencies name, each once, in order."""
    return list(dict.fromkeys(t for dep in deps for t in dep.ids))
