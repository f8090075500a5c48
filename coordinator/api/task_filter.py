"""Which tasks a ``TaskFilter`` names: ``gptrmctl tasks --user/--queue/--name/--state`` and bulk cancel.

Every field given must match; an empty field matches every task. ``users`` are submitter identities
(``Task.submitted_by``), ``queues`` queue names (``default`` is the default queue, as ``tasks``
shows it), ``name`` a shell pattern over the task's name (:func:`fnmatch.fnmatchcase`: ``*``, ``?``,
``[...]``), ``states`` task states.

Example::

    keep = task_matcher(request.filter, "filter")
    tasks = [t for t in tasks if keep(t)]
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable

from common.errors import ValidationError
from common.pb.gptrm.v1 import admin_pb2, types_pb2
from coordinator.queues import DEFAULT_QUEUE

__all__ = ["MAX_FILTER_ITEMS", "filter_given", "task_matcher"]

MAX_FILTER_ITEMS = 256
"""The most users, queues or states one filter lists."""
_MAX_TEXT = 253


def filter_given(f: admin_pb2.TaskFilter) -> bool:
    """Whether ``f`` names anything (a bulk cancel with an empty filter would name every task)."""
    return bool(f.users or f.queues or f.name or f.states)


def task_matcher(f: admin_pb2.TaskFilter, field: str = "filter") -> Callable[[types_pb2.Task], bool]:
    """A test of a task against ``f``.

    :raises ValidationError: a list too long, an empty or over-long entry, or an unknown state,
        naming the field (``filter.users[2]``)."""
    for name in ("users", "queues", "states"):
        items = getattr(f, name)
        if len(items) > MAX_FILTER_ITEMS:
            raise ValidationError(f"{field}.{name}", f"at most {MAX_FILTER_ITEMS} entries, got {len(items)}")
    for name in ("users", "queues"):
        for i, value in enumerate(getattr(f, name)):
            if not value.strip() or len(value) > _MAX_TEXT:
                raise ValidationError(f"{field}.{name}[{i}]", f"must be 1 to {_MAX_TEXT} characters, not blank")
    if len(f.name) > _MAX_TEXT:
        raise ValidationError(f"{field}.name", f"longer than {_MAX_TEXT} characters")
    for i, s in enumerate(f.states):
        if s not in types_pb2.TaskState.values() or s == 0:
            raise ValidationError(f"{field}.states[{i}]", f"unknown task state {s}")
    users = frozenset(f.users)
    queues = frozenset(q if q != DEFAULT_QUEUE.name else "" for q in f.queues) | frozenset(f.queues)
    states = frozenset(f.states)
    pattern = f.name

    def keep(t: types_pb2.Task) -> bool:
        return ((not users or t.submitted_by in users) and (not queues or t.queue in queues)
                and (not states or t.state in states)
                and (not pattern or fnmatch.fnmatchcase(t.spec.name, pattern)))
    return keep
