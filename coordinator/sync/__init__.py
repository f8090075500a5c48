"""etcd coordination for the coordinator: the only package that talks to etcd (CONTRIBUTING.md, Layout).

Example::

    client = connect(["127.0.0.1:2379"], timeout_s=2.0)
    keys = Keys()
    election = Election(client, keys, "coord-a", "10.0.0.5:7070", ttl_s=2.0, on_lost=stop_acting)
    election.start()
    store = Store(client, keys, election)
"""

from coordinator.sync._records import node_demand, placed_nodes
from coordinator.sync.client import KV, EtcdClient, EtcdTls, connect
from coordinator.sync.election import Election
from coordinator.sync.keys import DEFAULT_PREFIX, Keys
from coordinator.sync.leadership import LeaderRole, Leadership
from coordinator.sync.lease import Lease
from coordinator.sync.lock import AdminLocks, Lock
from coordinator.sync.state_machine import LEGAL_TRANSITIONS, Conflict, allowed_from, check_transition, is_legal
from coordinator.sync.store import CommitResult, PlacementCommit, Store, StoredState

__all__ = [
    "DEFAULT_PREFIX",
    "KV",
    "LEGAL_TRANSITIONS",
    "AdminLocks",
    "CommitResult",
    "Conflict",
    "Election",
    "EtcdClient",
    "EtcdTls",
    "Keys",
    "LeaderRole",
    "Leadership",
    "Lease",
    "Lock",
    "PlacementCommit",
    "Store",
    "StoredState",
    "allowed_from",
    "check_transition",
    "connect",
    "is_legal",
    "node_demand",
    "placed_nodes",
]
