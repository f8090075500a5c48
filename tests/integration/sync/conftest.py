"""Fixtures for the coordinator/sync tests: clients, keys, elections, a leading store, value builders.

Everything talks to the real etcd from ``etcd_server`` (tests/conftest.py), isolated by ``etcd_prefix``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from common.pb.gptrm.v1 import types_pb2
from coordinator.etcd_embedded import EtcdCluster
from coordinator.sync import Election, EtcdClient, Keys, Store, connect

ElectionFactory = Callable[..., Election]
"""make_election(candidate_id, *, client=None, ttl_s=2.0, **Election kwargs) → an unstarted Election."""


@pytest.fixture
def sync_client(etcd_server: EtcdCluster) -> Iterator[EtcdClient]:
    """A client connected to the session etcd."""
    client = connect(etcd_server.endpoints, timeout_s=2.0)
    yield client
    client.close()


@pytest.fixture
def client_factory(etcd_server: EtcdCluster) -> Iterator[Callable[[], EtcdClient]]:
    """Makes further independent clients (another coordinator process, in effect)."""
    made: list[EtcdClient] = []

    def make() -> EtcdClient:
        made.append(connect(etcd_server.endpoints, timeout_s=2.0))
        return made[-1]

    yield make
    for client in made:
        client.close()


@pytest.fixture
def keys(etcd_prefix: str) -> Keys:
    """Key names under the test's own prefix."""
    return Keys(etcd_prefix)


@pytest.fixture
def make_election(
    sync_client: EtcdClient, client_factory: Callable[[], EtcdClient], keys: Keys
) -> Iterator[ElectionFactory]:
    """Builds candidates on the test's leader key; every one resigns at teardown, before any client closes."""
    made: list[Election] = []

    def make(candidate_id: str, *, client: EtcdClient | None = None, ttl_s: float = 2.0, **kwargs: object) -> Election:
        election = Election(client or sync_client, keys, candidate_id, f"{candidate_id}.test:7070", ttl_s, **kwargs)
        made.append(election)
        return election

    yield make
    for election in made:
        election.resign()


@pytest.fixture
def depose(make_election: ElectionFactory, client_factory: Callable[[], EtcdClient]) -> Callable[[Election], Election]:
    """Depose a leader without its noticing: its lease revoked (as if it expired) and ``coord-b`` elected, while it
    (given a long TTL) still believes it leads, so that only fencing stands between it and the data; returns B."""
    def run(a: Election) -> Election:
        client_factory().revoke_lease(a.lease_id)  # type: ignore[arg-type]  # as if A's lease expired
        b = make_election("coord-b", client=client_factory())
        b.start()
        assert b.wait_for_leadership(timeout=3.0)
        assert a.is_leader   # A has not noticed
        return b
    return run


@pytest.fixture
def leader(make_election: ElectionFactory) -> Election:
    """A candidate that has won the election."""
    election = make_election("coord-a")
    assert election.acquire(timeout=5.0)
    return election


@pytest.fixture
def store(sync_client: EtcdClient, keys: Keys, leader: Election) -> Store:
    """A store whose writes are fenced by ``leader``."""
    return Store(sync_client, keys, leader)


def _node(node_id: str, gpus: int = 8) -> types_pb2.NodeRecord:
    inventory = types_pb2.NodeInventory(node_id=node_id, hostname=node_id, cpu_cores=64, mem_total_bytes=512 << 30)
    inventory.gpus.extend(types_pb2.GpuInfo(index=i, uuid=f"GPU-{node_id}-{i}", model="H100") for i in range(gpus))
    return types_pb2.NodeRecord(inventory=inventory, state=types_pb2.NODE_STATE_READY)


def _task(name: str = "job", gpus: float = 1.0) -> types_pb2.Task:
    spec = types_pb2.TaskSpec(name=name, kind=types_pb2.TASK_KIND_TRAINING, argv=["python", "train.py"])
    return types_pb2.Task(spec=spec, demand=types_pb2.ResourceVector(gpus=gpus, cpu_cores=4, mem_bytes=32 << 30))


def _allocation(node_id: str, gpu_indices: list[int], *, share: float = 1.0) -> types_pb2.Allocation:
    demand = types_pb2.ResourceVector(gpus=len(gpu_indices) * share, cpu_cores=4, mem_bytes=32 << 30)
    na = types_pb2.NodeAllocation(node_id=node_id, gpu_indices=gpu_indices, demand=demand, gpu_share=share)
    return types_pb2.Allocation(nodes=[na], decision_id=f"d-{node_id}-{gpu_indices}")


@pytest.fixture
def make_node() -> Callable[..., types_pb2.NodeRecord]:
    """make_node(node_id, gpus=8) → a READY NodeRecord with simulated H100s."""
    return _node


@pytest.fixture
def make_task() -> Callable[..., types_pb2.Task]:
    """make_task(name="job", gpus=1.0) → a new (unstored) training Task."""
    return _task


@pytest.fixture
def make_allocation() -> Callable[..., types_pb2.Allocation]:
    """make_allocation(node_id, gpu_indices, share=1.0) → an Allocation on one node (4 cores, 32 GiB)."""
    return _allocation
