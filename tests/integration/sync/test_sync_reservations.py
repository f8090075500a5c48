"""ReservationStore against real etcd: create once, list, delete, fencing, and unusable values set aside."""

from __future__ import annotations

import pytest

from common.errors import NotLeader, ValidationError
from common.pb.gptrm.v1 import types_pb2
from coordinator.reservations import validate_reservation
from coordinator.sync import EtcdClient, Keys
from coordinator.sync.client import op_put
from coordinator.sync.election import Election
from coordinator.sync.reservations import ReservationStore
from coordinator.sync.state_machine import Conflict
from tests.integration.sync.conftest import ElectionFactory


def _r(name: str = "demo") -> types_pb2.Reservation:
    return types_pb2.Reservation(name=name, gpus=2, start_unix_s=100.0, end_unix_s=200.0, queue="team-a")


def test_create_list_delete(sync_client: EtcdClient, keys: Keys, leader: Election) -> None:
    store = ReservationStore(sync_client, keys, leader, validate=validate_reservation)
    stored = store.create(_r())
    assert stored.revision > 0
    with pytest.raises(Conflict):
        store.create(_r())
    listed = store.list()
    assert list(listed) == ["demo"] and listed["demo"].gpus == 2 and listed["demo"].revision == stored.revision
    assert store.delete("demo") is True and store.delete("demo") is False
    assert store.list() == {}


def test_writes_need_leadership(sync_client: EtcdClient, keys: Keys, make_election: ElectionFactory) -> None:
    standby = ReservationStore(sync_client, keys, make_election("coord-z"))
    with pytest.raises(NotLeader):
        standby.create(_r())
    assert standby.list() == {}


def test_unusable_values_are_set_aside(sync_client: EtcdClient, keys: Keys, leader: Election) -> None:
    store = ReservationStore(sync_client, keys, leader, validate=validate_reservation)
    store.create(_r("good"))
    bad = _r("bad")
    bad.gpus = 0
    sync_client.txn([], [op_put(keys.reservation("junk"), b"\xff not a reservation"),
                         op_put(keys.reservation("other"), _r("named-else").SerializeToString()),
                         op_put(keys.reservation("bad"), bad.SerializeToString())])
    assert list(store.list()) == ["good"]
    with pytest.raises(ValidationError):
        validate_reservation(bad)
