"""The team queues in etcd: one key (``queues``) holding the whole tree, written as the leader.

The tree is one value so that a change is validated against every other queue and stored whole,
in one transaction: no reader ever sees a parent without its child or quotas that overcommit a
parent. Changes are serialised by the ``queues`` admin lock and compared on the key's revision.

A stored value is untrusted: larger than :data:`MAX_QUEUES_BYTES`, not JSON (nested too deep for the
parser included), or not a valid :class:`~coordinator.queues.QueueConfig` (beyond its bounds: too
many queues, too deep a tree, numbers out of range), it is moved under ``quarantine/`` and reads as
absent (the cluster then runs as if it had no queues until an admin sets them again).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from common.errors import CoordinationError, GptrmError, ValidationError
from coordinator.queues import QueueConfig
from coordinator.sync._fenced import FencedWriter
from coordinator.sync.client import KV, EtcdClient, cmp_create, cmp_mod, op_put
from coordinator.sync.election import Election
from coordinator.sync.keys import Keys
from coordinator.sync.quarantine import Quarantine
from coordinator.sync.state_machine import Conflict

__all__ = ["MAX_QUEUES_BYTES", "QueueStore", "StoredQueues"]

MAX_QUEUES_BYTES = 1 << 20
"""The largest queue tree stored or read, in bytes (the tree's own bounds, such as
:data:`~coordinator.queues.MAX_QUEUES`, are :class:`~coordinator.queues.QueueConfig`'s)."""


@dataclass(frozen=True, slots=True)
class StoredQueues:
    """The queue tree as stored, and the key's revision (0: none stored)."""

    config: QueueConfig
    revision: int


class QueueStore:
    """Reads and fenced writes of the queue tree.

    :param client: the etcd client.
    :param keys: key names.
    :param election: supplies the fencing epoch.
    :param quarantine: where an unusable stored tree goes.
    """

    def __init__(self, client: EtcdClient, keys: Keys, election: Election, *,
                 quarantine: Quarantine | None = None) -> None:
        self._client, self._keys = client, keys
        self._writer = FencedWriter(client, keys, election, quarantine=quarantine or Quarantine(client, keys, election))

    def get(self) -> StoredQueues:
        """The stored tree; an empty (unmanaged) one with revision 0 when none is stored or it was refused."""
        kv = self._client.get(self._keys.queues)
        stored = None if kv is None else self._writer.parse(kv, self._parse)
        return stored if stored is not None else StoredQueues(QueueConfig(), 0)

    def put(self, config: QueueConfig, revision: int) -> StoredQueues:
        """Store ``config`` if the key is still at ``revision`` (0: absent).

        :raises ValidationError: the tree is larger than :data:`MAX_QUEUES_BYTES`.
        :raises Conflict: another change came first.
        :raises NotLeader, Fenced: we do not lead.
        """
        data = encode(config)
        key = self._keys.queues
        guard = cmp_mod(key, revision) if revision else cmp_create(key, 0)
        result = self._writer.write([guard], [op_put(key, data)])
        if not result.succeeded:
            raise Conflict(f"queues: changed meanwhile (revision {revision})")
        return StoredQueues(config, result.revision)

    def _parse(self, kv: KV) -> StoredQueues:
        if len(kv.value) > MAX_QUEUES_BYTES:
            raise CoordinationError(f"etcd key {kv.key!r}: {len(kv.value)} bytes, at most {MAX_QUEUES_BYTES}")
        try:
            config = QueueConfig.from_dict(json.loads(kv.value))
        except (ValueError, TypeError, RecursionError, GptrmError) as e:
            raise CoordinationError(f"etcd key {kv.key!r}: not a queue tree: {e}") from None
        return StoredQueues(config, kv.mod_revision)


def encode(config: QueueConfig) -> bytes:
    """The stored form of a tree. :raises ValidationError: larger than :data:`MAX_QUEUES_BYTES`."""
    data = json.dumps(config.to_dict(), sort_keys=True, separators=(",", ":")).encode()
    if len(data) > MAX_QUEUES_BYTES:
        raise ValidationError("queues", f"{len(data)} bytes stored; at most {MAX_QUEUES_BYTES}")
    return data
