"""Tenants confined to their queues: which queues a caller's credential covers, what it may change
there, and the one redaction point of everything it reads.

**Coverage** (:func:`covers`): a cluster admin (role ``admin``, or the open mode's ``anonymous``)
covers every queue; a ``submitter`` the queues its credential names, or, naming none, the queues
whose ``members`` list it (as it may submit there); a ``queue-admin`` the queues it names and every
queue below them; a ``viewer`` none. A call on a task or a service (logs, pause, resume, cancel,
scale) is refused unless the caller covers the task's or service's queue (:func:`act_refusal`).

**Queue changes** (:func:`queue_change_refusal`): creating, changing or removing a queue needs
admin over its parent, now and after the change: a cluster admin, or a queue admin whose queues
include that parent or one of its ancestors. A top-level queue is the cluster admin's, so a team
can neither raise its own queue's limit nor add itself to another queue's members. Whose default
queue a queue is (``default_for``) only the cluster admin changes.

**Secrets** (:data:`SECRET_FIELDS`): the values of a task's ``spec.env`` (also in a service's
replica template), and a task's ``log_tail`` (the end of its output, which ``TaskLogs`` streams
to the same callers only). A caller that does not cover the queue (a viewer always) reads
:data:`REDACTED` in their place; the variable names stay. Every answer of the Admin service passes
through :func:`redacted` (its error-mapping wrapper calls it), so no read bypasses it.

Usage (:func:`usage_filter`): a team role reads the usage of the queues it covers only; a cluster
admin and a viewer read everyone's (usage holds no secrets; a viewer is a dashboard's role).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from common.errors import PermissionDenied
from coordinator.queues import DEFAULT_QUEUE, QueueConfig

__all__ = ["REDACTED", "SECRET_FIELDS", "Caller", "act_refusal", "covers", "queue_change_refusal", "redacted",
           "usage_filter"]

REDACTED = "<redacted>"
"""What a caller who may not see a secret field reads in its place."""

SECRET_FIELDS: dict[str, tuple[str, ...]] = {"gptrm.v1.TaskSpec": ("env",), "gptrm.v1.Task": ("log_tail",)}
"""Per message type, its fields that may hold secrets: ``env`` (its values) and ``log_tail``."""

_TEAM = ("submitter", "queue-admin")


class Caller(Protocol):
    """Who calls (``coordinator.api.auth.Principal``)."""

    @property
    def name(self) -> str: ...

    @property
    def role(self) -> str: ...

    @property
    def queues(self) -> tuple[str, ...]: ...

    @property
    def cluster_admin(self) -> bool: ...


def _below(config: QueueConfig, queue: str, roots: tuple[str, ...]) -> bool:
    """Whether ``queue`` is one of ``roots`` or lies below one of them in ``config``'s tree."""
    if queue in roots:
        return True
    return queue in config and any(a in roots for a in config.ancestors(queue))


def covers(caller: Caller | None, config: QueueConfig, queue: str) -> bool:
    """Whether ``caller`` may act on, and see the secrets of, what runs in ``queue`` ("" is the default queue).

    None (a servicer served without the auth interceptor: in-process tests) covers every queue, as it
    may submit anywhere."""
    if caller is None or caller.cluster_admin:
        return True
    queue = queue or DEFAULT_QUEUE.name
    if caller.role not in _TEAM:
        return False
    if not caller.queues:
        return config.may_submit(caller.name, queue)
    if caller.role == "queue-admin":
        return _below(config, queue, caller.queues)
    return queue in caller.queues


def _scope(caller: Caller) -> str:
    if caller.role not in _TEAM:
        return f"role {caller.role} acts on no queue"
    where = ", ".join(caller.queues) if caller.queues else "the queues whose members list it"
    return f"{caller.role} of {where}" + (" and the queues below" if caller.role == "queue-admin" else "")


def act_refusal(caller: Caller | None, config: QueueConfig, queue: str, what: str) -> PermissionDenied | None:
    """The refusal to raise when ``caller`` may not act on ``what`` (``task t-1``) in ``queue``, or None.

    :returns: a :class:`~common.errors.PermissionDenied` naming the caller, the thing and its queue,
        e.g. ``task t-1 is in queue 'a': 'bob' is submitter of b``; audited as ``refused``.
    """
    if covers(caller, config, queue):
        return None
    assert caller is not None
    return PermissionDenied(f"{what} is in queue {queue or DEFAULT_QUEUE.name!r}: {caller.name!r} is {_scope(caller)}",
                            caller.name, caller.role)


def _administers(caller: Caller, config: QueueConfig, queue: str | None) -> bool:
    if caller.cluster_admin:
        return True
    return queue is not None and caller.role == "queue-admin" and _below(config, queue, caller.queues)


def queue_change_refusal(caller: Caller | None, config: QueueConfig, name: str, parent: str | None,
                         default_for: tuple[str, ...] = ()) -> PermissionDenied | None:
    """The refusal to raise when ``caller`` may not create, change or remove queue ``name`` (so that it
    sits under ``parent``, None: top level, and is the default queue of ``default_for``; a removal
    passes the empty tuple), or None when it may: it needs admin over the queue's parent now (when
    the queue exists) and over ``parent``; and whose default queue it is stays the cluster admin's
    choice (it routes the submissions of identities outside the team).

    A stored tree read between this check and the write may have moved the queue meanwhile: only
    another caller with admin over its old parent can have moved it.
    """
    if caller is None or caller.cluster_admin:
        return None
    exists = config.managed and name in config
    now = config.get(name).parent if exists else parent
    for where in dict.fromkeys((now, parent)):
        if not _administers(caller, config, where):
            above = f"its parent {where!r}" if where is not None else "the top level (the cluster admin's)"
            return PermissionDenied(f"queue {name!r}: changing it needs admin over {above}; {caller.name!r} is "
                                    f"{_scope(caller)}", caller.name, caller.role)
    if set(default_for) != set(config.get(name).default_for if exists else ()):
        return PermissionDenied(f"queue {name!r}: whose default queue it is (default_for) is the cluster admin's "
                                f"to change; {caller.name!r} is {_scope(caller)}", caller.name, caller.role)
    return None


def usage_filter(caller: Caller | None, config: QueueConfig) -> Callable[[str], bool] | None:
    """Which queues' usage ``caller`` reads: None for all (a cluster admin, a viewer), else a test of a
    queue name (a team role: the queues it covers)."""
    if caller is None or caller.role not in _TEAM:
        return None
    return lambda queue: covers(caller, config, queue)


# ---- the redaction point ------------------------------------------------------------------------

_HOLDS: dict[str, bool] = {}
_PATHS: dict[str, tuple[FieldDescriptor, ...]] = {}


def _message_type(fd: FieldDescriptor) -> Descriptor | None:
    """The message a field holds (a map's value message), or None for scalars."""
    mt = fd.message_type
    if mt is None:
        return None
    if mt.GetOptions().map_entry:
        return mt.fields_by_name["value"].message_type
    return mt


def _holds_secrets(desc: Any) -> bool:
    """Whether a message of type ``desc`` can hold a secret field (itself, or a message within it).

    Decided once per type, over every type reachable from it (a closed set, so recursive types are
    decided exactly), and kept with, per type, the fields that lead to a secret (:data:`_PATHS`)."""
    if desc.full_name in _HOLDS:
        return _HOLDS[desc.full_name]
    reachable: dict[str, Any] = {}
    todo = [desc]
    while todo:
        d = todo.pop()
        if d.full_name in reachable or d.full_name in _HOLDS:
            continue
        reachable[d.full_name] = d
        todo.extend(mt for fd in d.fields if (mt := _message_type(fd)) is not None)
    holds = {name: name in SECRET_FIELDS for name in reachable}
    changed = True
    while changed:
        changed = False
        for name, d in reachable.items():
            if not holds[name] and any((mt := _message_type(fd)) is not None
                                       and holds.get(mt.full_name, _HOLDS.get(mt.full_name, False))
                                       for fd in d.fields):
                holds[name] = changed = True
    for name, d in reachable.items():
        _PATHS[name] = tuple(fd for fd in d.fields if (mt := _message_type(fd)) is not None
                             and holds.get(mt.full_name, _HOLDS.get(mt.full_name, False)))
    _HOLDS.update(holds)
    return _HOLDS[desc.full_name]


def _redact(msg: Message, sees: Callable[[str], bool], queue: str | None) -> None:
    desc = msg.DESCRIPTOR
    kind = desc.full_name
    m: Any = msg
    if kind == "gptrm.v1.Task":
        queue = m.queue
    elif kind == "gptrm.v1.Service":
        queue = m.spec.queue
    elif kind == "gptrm.v1.TaskSpec" and queue is None:
        queue = m.queue
    if kind in SECRET_FIELDS and not sees(queue or ""):
        if kind == "gptrm.v1.TaskSpec":
            for key in list(m.env):
                m.env[key] = REDACTED
        elif m.log_tail:
            m.log_tail = REDACTED
    for fd in _PATHS[kind]:
        value = getattr(m, fd.name)
        if isinstance(value, Message):
            if m.HasField(fd.name):
                _redact(value, sees, queue)
        else:   # a repeated field, or a map (its values)
            for item in (value.values() if hasattr(value, "values") else value):
                _redact(item, sees, queue)


def redacted(message: Any, caller: Caller | None, config: QueueConfig) -> Any:
    """``message`` as ``caller`` may read it: itself when nothing in it is hidden from the caller, else a
    copy with every secret field of a queue the caller does not cover replaced by :data:`REDACTED`
    (never changed in place: answers may be the leader's own records)."""
    if not isinstance(message, Message) or caller is None or caller.cluster_admin \
            or not _holds_secrets(message.DESCRIPTOR):
        return message
    seen: dict[str, bool] = {}

    def sees(queue: str) -> bool:
        if queue not in seen:
            seen[queue] = covers(caller, config, queue)
        return seen[queue]
    out = type(message)()
    out.CopyFrom(message)
    _redact(out, sees, None)
    return out
