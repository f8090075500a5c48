"""Reservations in etcd (``reservations/<name>``), written by the leader, fenced.

A reservation is created once (compare on the key not existing) and removed whole; it is never changed
in place. A stored value is untrusted: one that does not parse, names another reservation, or fails
``validate`` is moved under ``quarantine/`` and reads as absent.

Example::

    store = ReservationStore(client, keys, election)
    stored = store.create(types_pb2.Reservation(name="demo", gpus=2, start_unix_s=t0, end_unix_s=t1, queue="a"))
    store.list()                    # {"demo": ...}
    store.delete("demo")            # True when it was there
"""

from __future__ import annotations

from collections.abc import Callable

from common.errors import CoordinationError
from common.pb.gptrm.v1 import types_pb2
from coordinator.sync import _records as rec
from coordinator.sync._fenced import FencedWriter
from coordinator.sync.client import KV, EtcdClient, cmp_create, cmp_exists, op_delete, op_put
from coordinator.sync.election import Election
from coordinator.sync.keys import Keys
from coordinator.sync.quarantine import Quarantine
from coordinator.sync.state_machine import Conflict

__all__ = ["ReservationStore"]


class ReservationStore:
    """Reads and fenced writes of reservations.

    :param client: the etcd client.
    :param keys: key names.
    :param election: supplies the fencing epoch (a deposed leader's write raises ``Fenced``).
    :param quarantine: where an unusable stored reservation goes.
    :param validate: checks a stored reservation's fields (raises ``ValidationError``).
    """

    def __init__(self, client: EtcdClient, keys: Keys, election: Election, *, quarantine: Quarantine | None = None,
                 validate: Callable[[types_pb2.Reservation], None] | None = None) -> None:
        self._client, self._keys, self._validate = client, keys, validate
        self._writer = FencedWriter(client, keys, election, quarantine=quarantine or Quarantine(client, keys, election))

    def create(self, reservation: types_pb2.Reservation) -> types_pb2.Reservation:
        """Store a new reservation.

        :returns: it as stored, with its revision.
        :raises Conflict: one of that name exists.
        :raises NotLeader, Fenced: we do not lead.
        """
        key = self._keys.reservation(reservation.name)
        stored = types_pb2.Reservation()
        stored.CopyFrom(reservation)
        stored.ClearField("revision")
        result = self._writer.write([cmp_create(key, 0)], [op_put(key, stored.SerializeToString())])
        if not result.succeeded:
            raise Conflict(f"reservation {reservation.name}: one of that name exists")
        stored.revision = result.revision
        return stored

    def delete(self, name: str) -> bool:
        """Remove a reservation; False when there was none.

        :raises NotLeader, Fenced: we do not lead.
        """
        key = self._keys.reservation(name)
        return self._writer.write([cmp_exists(key)], [op_delete(key)]).succeeded

    def list(self) -> dict[str, types_pb2.Reservation]:
        """Every stored reservation by name; one that does not parse or validate is moved aside and left out."""
        kvs, _ = self._client.range_prefix(self._keys.reservations_prefix)
        return {r.name: r for r in (self._writer.parse(kv, self._parse) for kv in kvs) if r is not None}

    def _parse(self, kv: KV) -> types_pb2.Reservation:
        r = rec.decode(types_pb2.Reservation, kv)
        name = self._keys.name_of(kv.key, self._keys.reservations_prefix)
        if r.name != name:
            raise CoordinationError(f"etcd key {kv.key!r} holds reservation {r.name!r}")
        if self._validate is not None:
            self._validate(r)
        r.revision = kv.mod_revision
        return r
