"""Plain values and transaction builders for ``EtcdClient`` (what a key, a txn result and a watch event are)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol, TypeAlias

from etcd3 import etcdrpc

__all__ = [
    "KV",
    "Compare",
    "Op",
    "TxnResult",
    "WatchCallback",
    "WatchEvent",
    "cmp_create",
    "cmp_exists",
    "cmp_mod",
    "cmp_value",
    "kv_from_meta",
    "kv_from_proto",
    "op_delete",
    "op_get",
    "op_put",
]

# Compares and operations are etcd's own request messages, built here once and put into the
# ``TxnRequest`` as they are: etcd3's transaction objects were turned into the same messages by
# Python code per operation on every transaction, a measurable share of a placement commit.
Compare: TypeAlias = etcdrpc.Compare
"""One comparison of a transaction (build it with :func:`cmp_create`, :func:`cmp_mod`, :func:`cmp_value`)."""
Op: TypeAlias = etcdrpc.RequestOp
"""One operation of a transaction (build it with :func:`op_put`, :func:`op_get`, :func:`op_delete`)."""

_EQUAL, _GREATER = etcdrpc.Compare.EQUAL, etcdrpc.Compare.GREATER
_VERSION, _CREATE = etcdrpc.Compare.VERSION, etcdrpc.Compare.CREATE
_MOD, _VALUE = etcdrpc.Compare.MOD, etcdrpc.Compare.VALUE


@dataclass(frozen=True, slots=True)
class KV:
    """One key as etcd stores it."""

    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease_id: int


@dataclass(frozen=True, slots=True)
class TxnResult:
    """Outcome of :meth:`EtcdClient.txn`.

    :ivar succeeded: every comparison held, so the success branch ran.
    :ivar revision: store revision after the transaction (0 when etcd did not say).
    :ivar responses: one entry per operation of the branch that ran: the keys found for a get, None otherwise.
    """

    succeeded: bool
    revision: int
    responses: list[list[KV] | None]


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """A change of a watched key."""

    kind: Literal["put", "delete"]
    kv: KV


WatchCallback = Callable[[list[WatchEvent] | None], None]
"""Called on etcd's watch thread with the events of one response, or None when the watch broke."""


def cmp_create(key: str, revision: int) -> Compare:
    """Compare: the key's create revision equals ``revision`` (0: the key does not exist)."""
    return etcdrpc.Compare(key=key.encode(), result=_EQUAL, target=_CREATE, create_revision=revision)


def cmp_mod(key: str, revision: int) -> Compare:
    """Compare: the key's last modification revision equals ``revision``."""
    return etcdrpc.Compare(key=key.encode(), result=_EQUAL, target=_MOD, mod_revision=revision)


def cmp_exists(key: str) -> Compare:
    """Compare: the key exists."""
    return etcdrpc.Compare(key=key.encode(), result=_GREATER, target=_VERSION, version=0)


def cmp_value(key: str, value: bytes) -> Compare:
    """Compare: the key holds exactly ``value``."""
    return etcdrpc.Compare(key=key.encode(), result=_EQUAL, target=_VALUE, value=value)


def op_put(key: str, value: bytes, lease_id: int = 0) -> Op:
    """Operation: write ``value`` at ``key``, bound to ``lease_id`` when non-zero."""
    return etcdrpc.RequestOp(request_put=etcdrpc.PutRequest(key=key.encode(), value=value, lease=lease_id))


def op_get(key: str) -> Op:
    """Operation: read ``key``; the result is a list of zero or one :class:`KV`."""
    return etcdrpc.RequestOp(request_range=etcdrpc.RangeRequest(key=key.encode()))


def op_delete(key: str) -> Op:
    """Operation: delete ``key``."""
    return etcdrpc.RequestOp(request_delete_range=etcdrpc.DeleteRangeRequest(key=key.encode()))


class KVMetadata(Protocol):
    """What :func:`kv_from_meta` reads of etcd3's ``KVMetadata`` (etcd3 ships no types)."""

    key: bytes | str
    create_revision: int
    mod_revision: int
    version: int
    lease_id: int


class KeyValueProto(Protocol):
    """What :func:`kv_from_proto` reads of an etcd ``mvccpb.KeyValue`` or of etcd3's watch event."""

    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int


def kv_from_meta(value: bytes, meta: KVMetadata) -> KV:
    """A :class:`KV` from etcd3's (value, KVMetadata) pair."""
    key = meta.key
    return KV(
        key=key.decode() if isinstance(key, bytes) else str(key),
        value=bytes(value),
        create_revision=meta.create_revision,
        mod_revision=meta.mod_revision,
        version=meta.version,
        lease_id=meta.lease_id,
    )


def kv_from_proto(kv: KeyValueProto) -> KV:
    """A :class:`KV` from an etcd ``mvccpb.KeyValue`` (or etcd3's watch event, which proxies one)."""
    return KV(kv.key.decode(), bytes(kv.value), kv.create_revision, kv.mod_revision, kv.version, kv.lease)
