"""Service records in etcd (``services/<id>``): the replica count the leader's controller keeps, fenced;
and each service's load history (``service-history/<id>``), so a new leader continues its forecast.

Example::

    services = ServiceStore(client, keys, election)
    svc = services.put(types_pb2.Service(id="s-1f3a", spec=spec, desired=1))    # created
    svc.desired = 2
    svc = services.put(svc)            # compare on svc.revision: a concurrent change raises Conflict
    services.put_history(types_pb2.ServiceLoadHistory(service_id="s-1f3a", bucket_s=60, ...))
    services.get_history("s-1f3a")     # None when none is stored
"""

from __future__ import annotations

import math
from collections.abc import Callable

from common.errors import CoordinationError, NotFound, ValidationError
from common.pb.gptrm.v1 import types_pb2
from coordinator.sync import _records as rec
from coordinator.sync._fenced import FencedWriter
from coordinator.sync.client import KV, EtcdClient, cmp_create, cmp_mod, op_put
from coordinator.sync.election import Election
from coordinator.sync.keys import Keys
from coordinator.sync.quarantine import Quarantine
from coordinator.sync.state_machine import Conflict

__all__ = ["MAX_HISTORY_BYTES", "ServiceStore"]

MAX_HISTORY_BYTES = 1 << 20
"""The largest stored load history read (etcd's default request limit is 1.5 MiB)."""

_VIEW_FIELDS = ("revision", "signal", "load", "forecast_load", "forecast_replicas", "forecast_mape", "forecast_model")
"""Fields of ``Service`` that are the leader's current view, never stored."""


class ServiceStore:
    """Reads and fenced writes of service records.

    :param client: the etcd client.
    :param keys: key names.
    :param election: supplies the fencing epoch (a deposed leader's write raises ``Fenced``).
    :param max_history_bytes: a stored load history larger than this is refused before it is decoded.
    :param quarantine: where a stored service or load history that does not parse or validate goes (moved
        aside, then read as absent); by default one of its own.
    :param validate: checks a stored service's spec (raises ``ValidationError``), e.g. the controller's rules.
    """

    def __init__(self, client: EtcdClient, keys: Keys, election: Election,
                 max_history_bytes: int = MAX_HISTORY_BYTES, *, quarantine: Quarantine | None = None,
                 validate: Callable[[types_pb2.Service], None] | None = None) -> None:
        self._client, self._keys, self._max_history_bytes = client, keys, max_history_bytes
        self._validate = validate
        self._writer = FencedWriter(client, keys, election, quarantine=quarantine or Quarantine(client, keys, election))

    def put(self, service: types_pb2.Service) -> types_pb2.Service:
        """Create (``revision`` 0) or update (compare on ``revision``) one service.

        :returns: the record as stored, with its new revision.
        :raises Conflict: the record changed since ``revision`` was read (or exists already on create).
        :raises NotLeader, Fenced: we do not lead.
        """
        key = self._keys.service(service.id)
        stored = types_pb2.Service()
        stored.CopyFrom(service)
        for name in _VIEW_FIELDS:
            stored.ClearField(name)
        guard = cmp_mod(key, service.revision) if service.revision else cmp_create(key, 0)
        result = self._writer.write([guard], [op_put(key, stored.SerializeToString())])
        if not result.succeeded:
            raise Conflict(f"service {service.id}: changed meanwhile (revision {service.revision})")
        stored.revision = result.revision
        return stored

    def get(self, service_id: str) -> types_pb2.Service:
        """:raises NotFound: no such service (or the one stored was refused and moved aside)."""
        kv = self._client.get(self._keys.service(service_id))
        svc = None if kv is None else self._writer.parse(kv, self._parse)
        if svc is None:
            raise NotFound(f"service {service_id!r} not found")
        return svc

    def list(self) -> dict[str, types_pb2.Service]:
        """Every stored service by id; one that does not parse or validate is moved aside and left out."""
        kvs, _ = self._client.range_prefix(self._keys.services_prefix)
        return {svc.id: svc for svc in (self._writer.parse(kv, self._parse) for kv in kvs) if svc is not None}

    def put_history(self, history: types_pb2.ServiceLoadHistory) -> None:
        """Store one service's load history (fenced; the last write wins: only the leader writes it).

        :raises ValidationError: it is larger than ``max_history_bytes`` (it could not be read back).
        :raises NotLeader, Fenced: we do not lead.
        """
        data = history.SerializeToString()
        if len(data) > self._max_history_bytes:
            raise ValidationError("service_history", f"{len(data)} bytes; at most {self._max_history_bytes}")
        self._writer.write([], [op_put(self._keys.service_history(history.service_id), data)])

    def get_history(self, service_id: str) -> types_pb2.ServiceLoadHistory | None:
        """The stored load history, None when there is none.

        A value larger than ``max_history_bytes`` (not decoded), not a ``ServiceLoadHistory``, naming another
        service, without one time per scored error, or with a capacity that is not a finite non-negative
        number is moved aside and reads as None. (Whether its buckets fit a controller's history is
        :meth:`~coordinator.adaptor.forecast.LoadHistory.restore`'s question.)
        """
        kv = self._client.get(self._keys.service_history(service_id))
        return None if kv is None else self._writer.parse(kv, lambda v: self._parse_history(service_id, v))

    def _parse_history(self, service_id: str, kv: KV) -> types_pb2.ServiceLoadHistory:
        key = kv.key
        if len(kv.value) > self._max_history_bytes:
            raise CoordinationError(f"etcd key {key!r}: {len(kv.value)} bytes, at most {self._max_history_bytes}")
        history = rec.decode(types_pb2.ServiceLoadHistory, kv)
        if history.service_id != service_id:
            raise CoordinationError(f"etcd key {key!r} holds the history of {history.service_id!r}")
        if len(history.error_times_unix_s) != len(history.errors):
            raise CoordinationError(f"etcd key {key!r}: {len(history.error_times_unix_s)} error times for "
                                    f"{len(history.errors)} errors")
        if not (math.isfinite(history.capacity) and history.capacity >= 0):
            raise CoordinationError(f"etcd key {key!r}: capacity {history.capacity} is not a finite non-negative "
                                    "number")
        return history

    def _parse(self, kv: KV) -> types_pb2.Service:
        svc = rec.decode(types_pb2.Service, kv)
        name = self._keys.name_of(kv.key, self._keys.services_prefix)
        if svc.id != name:
            raise CoordinationError(f"etcd key {kv.key!r} holds service {svc.id!r}")
        if self._validate is not None:
            self._validate(svc)
        svc.revision = kv.mod_revision
        return svc
