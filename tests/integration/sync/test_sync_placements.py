"""commit_placements against a real etcd: batching under etcd's op limit, stale tasks, holdings derived from the
allocations, no GPU booked twice across a leader change."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from common.errors import EtcdUnavailable, Fenced, IllegalTransition
from common.pb.gptrm.v1 import types_pb2
from common.types import TaskState
from coordinator.monitor.nodes import NodeRegistry
from coordinator.state import LeaderState
from coordinator.sync import Conflict, Election, EtcdClient, Keys, Store
from coordinator.sync.client import op_put
from tests.helpers.holdings import held_gpus

S = TaskState


def stored_tasks(store: Store, count: int, make_task: Callable) -> list[types_pb2.Task]:
    """``count`` fresh PENDING tasks."""
    return [store.create_task(make_task(f"job-{i}")) for i in range(count)]


class TestCommitPlacements:
    """commit_placements(): batches, fallback, whole GPUs checked against what is held."""

    def test_many_placements_split_into_transactions_within_128_ops(
        self, store: Store, make_node: Callable, make_task: Callable, make_allocation: Callable
    ) -> None:
        """100 placements on 10 nodes commit in 2 transactions, every node holds what they placed, and no node
        record is written."""
        for n in range(10):
            store.put_node(make_node(f"n{n}", gpus=10))
        nodes_before = {n.inventory.node_id: n for n in store.list_nodes()}
        tasks = stored_tasks(store, 100, make_task)
        placements = [(t, t.revision, make_allocation(f"n{i % 10}", [i // 10])) for i, t in enumerate(tasks)]
        result = store.commit_placements(placements)
        # Compares per batch: 1 fencing + 2 per placement ≤ 128: 63 + 37 → 2 transactions.
        assert result.rejected == {}
        assert set(result.committed) == {t.id for t in tasks}
        assert result.transactions == 2
        state = store.load_all()
        assert all(state.tasks[t.id].state == S.SCHEDULED for t in tasks)
        assert set(state.allocations) == {t.id for t in tasks}
        assert held_gpus(store) == {f"n{n}": list(range(10)) for n in range(10)}
        assert state.nodes == nodes_before
        # The committed revision is the one a follow-up transition must name.
        first = tasks[0]
        store.transition(first.id, result.committed[first.id], S.STARTING, "agent acknowledged")

    def test_smaller_op_limit_makes_more_batches(
        self,
        sync_client: EtcdClient,
        keys: Keys,
        leader: Election,
        make_node: Callable,
        make_task: Callable,
        make_allocation: Callable,
    ) -> None:
        """With max_txn_ops=20, 30 placements on one node take 4 transactions of ≤ 9 placements."""
        small = Store(sync_client, keys, leader, max_txn_ops=20)
        small.put_node(make_node("n1", gpus=30))
        tasks = stored_tasks(small, 30, make_task)
        result = small.commit_placements([(t, t.revision, make_allocation("n1", [i])) for i, t in enumerate(tasks)])
        # 1 + 2·p + 1 ≤ 20 → p ≤ 9 per transaction: 9 + 9 + 9 + 3.
        assert len(result.committed) == 30 and result.transactions == 4
        assert held_gpus(small) == {"n1": list(range(30))}

    def test_stale_task_does_not_block_the_batch(
        self, store: Store, make_node: Callable, make_task: Callable, make_allocation: Callable
    ) -> None:
        """One task changed since it was read is rejected with Conflict; the other 19 still commit."""
        store.put_node(make_node("n1", gpus=20))
        tasks = stored_tasks(store, 20, make_task)
        stale = tasks[7]
        store.update_task(stale.id, stale.revision, log_tail="touched by someone else")
        result = store.commit_placements([(t, t.revision, make_allocation("n1", [i])) for i, t in enumerate(tasks)])
        assert set(result.rejected) == {stale.id}
        assert isinstance(result.rejected[stale.id], Conflict)
        assert "changed" in str(result.rejected[stale.id])
        assert len(result.committed) == 19
        assert held_gpus(store) == {"n1": [i for i in range(20) if i != 7]}  # only committed ones
        assert store.get_allocation(stale.id) is None
        assert store.get_task(stale.id).state == S.PENDING

    def test_taken_gpu_and_wrong_state_are_rejected(
        self, store: Store, make_node: Callable, make_task: Callable, make_allocation: Callable
    ) -> None:
        """A GPU already held (by what ``held`` says or by an earlier placement of the call) and a non-PENDING task
        are each rejected with a reason, before anything is sent."""
        store.put_node(make_node("n1"))
        a, b, c, d = stored_tasks(store, 4, make_task)
        d = store.transition(d.id, d.revision, S.CANCELLED, "user")
        state = LeaderState(NodeRegistry(1.0, 10.0))
        state.hold("x", make_allocation("n1", [6]).nodes)   # held by a task placed before
        result = store.commit_placements(
            [
                (a, a.revision, make_allocation("n1", [0, 1])),
                (b, b.revision, make_allocation("n1", [1, 2])),  # GPU 1 is a's
                (c, c.revision, make_allocation("n1", [6, 7])),  # GPU 6 is x's
                (d, d.revision, make_allocation("n1", [5])),
            ],
            state.holdings.reservation_on,
        )
        assert set(result.committed) == {a.id}
        assert isinstance(result.rejected[b.id], Conflict) and "GPU 1 already reserved" in str(result.rejected[b.id])
        assert isinstance(result.rejected[c.id], Conflict) and "GPU 6 already reserved" in str(result.rejected[c.id])
        assert isinstance(result.rejected[d.id], IllegalTransition)
        assert held_gpus(store) == {"n1": [0, 1]}
        assert store.get_allocation(b.id) is None and store.get_allocation(c.id) is None

    def test_shared_gpus_are_counted_per_task(
        self, store: Store, make_node: Callable, make_task: Callable, make_allocation: Callable
    ) -> None:
        """Two half-GPU tasks on GPU 3 reserve it twice; releasing one leaves the other's share."""
        store.put_node(make_node("n1"))
        a, b = stored_tasks(store, 2, make_task)
        result = store.commit_placements(
            [
                (a, a.revision, make_allocation("n1", [3], share=0.5)),
                (b, b.revision, make_allocation("n1", [3], share=0.5)),
            ]
        )
        assert len(result.committed) == 2
        assert held_gpus(store) == {"n1": [3, 3]}
        assert store.release_allocation(a.id) is True
        assert held_gpus(store) == {"n1": [3]}

    def test_allocation_record_and_task_agree(
        self,
        store: Store,
        leader: Election,
        make_node: Callable,
        make_task: Callable,
        make_allocation: Callable,
    ) -> None:
        """The allocation is stored with the task id, leader epoch and creation time, and copied into the task."""
        store.put_node(make_node("n1"))
        (task,) = stored_tasks(store, 1, make_task)
        result = store.commit_placements([(task, task.revision, make_allocation("n1", [4]))])
        alloc = store.get_allocation(task.id)
        assert alloc is not None
        assert alloc.task_id == task.id and alloc.leader_epoch == leader.epoch and alloc.created_unix_s > 0
        assert store.get_task(task.id).allocation == alloc
        assert store.get_task(task.id) == result.stored[task.id]

    def test_release_allocation(
        self, store: Store, make_node: Callable, make_task: Callable, make_allocation: Callable
    ) -> None:
        """Releasing deletes the allocation (the node holds nothing); a second release finds nothing."""
        store.put_node(make_node("n1"))
        (task,) = stored_tasks(store, 1, make_task)
        store.commit_placements([(task, task.revision, make_allocation("n1", [0, 1, 2]))])
        assert store.release_allocation(task.id) is True
        assert held_gpus(store) == {}
        assert store.release_allocation(task.id) is False


class TestPipelinedCommits:
    """Several batches in flight, each fenced, each placement all or nothing."""

    def test_many_batches_in_flight_commit_everything_once(
        self, sync_client: EtcdClient, keys: Keys, leader: Election, make_node: Callable, make_task: Callable,
        make_allocation: Callable,
    ) -> None:
        """240 placements over 12 nodes in shuffled order, 4 transactions in flight: every placement commits once,
        and a new leader's view read from etcd holds exactly what the leader built in memory from the answers."""
        store = Store(sync_client, keys, leader, max_txn_ops=64, max_txns_in_flight=4)
        for n in range(12):
            store.put_node(make_node(f"n{n}", gpus=20))
        tasks = stored_tasks(store, 240, make_task)
        mine, theirs = NodeRegistry(heartbeat_interval_s=1.0, lost_grace_s=10.0), NodeRegistry(1.0, 10.0)
        leading = LeaderState(mine)
        leading.adopt({t.id: t for t in tasks}, {n.inventory.node_id: n for n in store.list_nodes()}, {})
        placements = [(t, t.revision, make_allocation(f"n{i % 12}", [i // 12])) for i, t in enumerate(tasks)]
        result = store.commit_placements(placements[::-1], leading.holdings.reservation_on)
        assert result.rejected == {} and len(result.committed) == 240
        assert result.transactions == 8   # 1 + 2 × 31 compares ≤ 64: 31 placements per transaction
        for stored in result.stored.values():
            leading.apply_placement(stored)
        state = store.load_all()
        assert {tid: t.revision for tid, t in state.tasks.items()} == result.committed
        assert all(state.tasks[tid] == stored for tid, stored in result.stored.items())
        recovered = LeaderState(theirs)
        recovered.adopt(state.tasks, state.nodes, state.allocations)
        assert dict(recovered.tasks) == dict(leading.tasks)
        for n in range(12):
            a, b = mine.get(f"n{n}"), theirs.get(f"n{n}")
            assert a is not None and b is not None
            assert a.reservation == b.reservation and a.reservation.gpu_indices == tuple(range(20))
            assert a.task_ids == b.task_ids and len(a.task_ids) == 20

    def test_one_failed_compare_leaves_nothing_and_the_rest_commit(
        self, sync_client: EtcdClient, keys: Keys, leader: Election, make_node: Callable, make_task: Callable,
        make_allocation: Callable,
    ) -> None:
        """In one of several batches in flight a task changed meanwhile: that placement leaves no task state and no
        allocation behind; every other placement, in its batch and in the others, commits."""
        store = Store(sync_client, keys, leader, max_txn_ops=32, max_txns_in_flight=3)
        for n in range(6):
            store.put_node(make_node(f"n{n}", gpus=10))
        tasks = stored_tasks(store, 60, make_task)
        stale = tasks[17]   # on n5, GPU 2
        store.update_task(stale.id, stale.revision, log_tail="touched by someone else")
        result = store.commit_placements(
            [(t, t.revision, make_allocation(f"n{i % 6}", [i // 6])) for i, t in enumerate(tasks)])
        assert set(result.rejected) == {stale.id} and isinstance(result.rejected[stale.id], Conflict)
        assert len(result.committed) == 59
        assert store.get_task(stale.id).state == S.PENDING and store.get_allocation(stale.id) is None
        assert held_gpus(store)["n5"] == [0, 1, 3, 4, 5, 6, 7, 8, 9]


class TestLeaderChange:
    """No GPU is booked twice across a leader change, with reservations derived from the allocations."""

    def test_a_new_leader_never_books_a_gpu_the_old_one_placed(
        self, make_election: Callable, client_factory: Callable[[], EtcdClient], keys: Keys, make_node: Callable,
        make_task: Callable, make_allocation: Callable, depose: Callable[[Election], Election],
    ) -> None:
        """Leader A places tasks on GPUs 0-7 of n0, then loses its lease without noticing; its next placements (GPUs
        8-15) are fenced. Leader B takes over from etcd (as ``App.take_over`` does: ``load_all``, then ``adopt``),
        and asks for every GPU 0-15 for new tasks: the 8 A placed are refused as held, the 8 free ones commit, and
        the stored allocations hold each GPU once."""
        a = make_election("coord-a", ttl_s=10.0)
        assert a.acquire(timeout=5.0)
        store_a = Store(client_factory(), keys, a, max_txn_ops=16, max_txns_in_flight=4)
        store_a.put_node(make_node("n0", gpus=16))
        first = stored_tasks(store_a, 8, make_task)
        done = store_a.commit_placements([(t, t.revision, make_allocation("n0", [i])) for i, t in enumerate(first)])
        assert len(done.committed) == 8
        late = stored_tasks(store_a, 8, make_task)
        b = depose(a)
        with pytest.raises(Fenced):
            store_a.commit_placements([(t, t.revision, make_allocation("n0", [8 + i])) for i, t in enumerate(late)])
        store_b = Store(client_factory(), keys, b)
        loaded = store_b.load_all()
        assert loaded.revision >= b.epoch   # read after B won: every write of A's is below B's epoch
        view = LeaderState(NodeRegistry(1.0, 10.0))
        view.adopt(loaded.tasks, loaded.nodes, loaded.allocations)
        assert view.holdings.reservation_on("n0").gpu_indices == tuple(range(8))
        fresh = stored_tasks(store_b, 16, make_task)
        result = store_b.commit_placements([(t, t.revision, make_allocation("n0", [i])) for i, t in enumerate(fresh)],
                                           view.holdings.reservation_on)
        assert set(result.committed) == {t.id for t in fresh[8:]}
        assert all(isinstance(result.rejected[t.id], Conflict) for t in fresh[:8])
        assert held_gpus(store_b) == {"n0": list(range(16))}   # each GPU once
        assert all(store_b.get_allocation(t.id) is None for t in late)

    def test_an_older_layouts_node_totals_are_ignored_and_cleared(
        self, store: Store, sync_client: EtcdClient, keys: Keys, make_node: Callable, make_task: Callable,
        make_allocation: Callable,
    ) -> None:
        """A node record written by the older layout still carries its totals (GPUs 0-3 of n1, of which only GPU 0
        is still allocated): a new leader reads the record without them and holds what the allocations hold; the
        next write of the record (a heartbeat) stores it without them."""
        store.put_node(make_node("n1"))
        (task,) = stored_tasks(store, 1, make_task)
        store.commit_placements([(task, task.revision, make_allocation("n1", [0]))])
        old = make_node("n1")
        old.reserved_gpu_indices.extend([0, 1, 2, 3])
        old.reserved.gpus = 4
        sync_client.txn([], [op_put(keys.node("n1"), old.SerializeToString())])   # as the older layout wrote it
        loaded = store.load_all()
        assert not loaded.nodes["n1"].reserved_gpu_indices and not loaded.nodes["n1"].HasField("reserved")
        assert held_gpus(store) == {"n1": [0]}
        store.put_node(loaded.nodes["n1"])
        raw = types_pb2.NodeRecord.FromString(sync_client.get(keys.node("n1")).value)  # type: ignore[union-attr]
        assert not raw.reserved_gpu_indices and not raw.HasField("reserved")

    def test_deposed_leader_commits_nothing(
        self, make_election: Callable, sync_client: EtcdClient, keys: Keys, make_node: Callable,
        make_task: Callable, make_allocation: Callable, depose: Callable[[Election], Election],
    ) -> None:
        """A leader deposed without noticing it sends its batches (several in flight): every one is fenced, the
        call raises Fenced, the leader steps down, and etcd holds no placement of it."""
        a = make_election("coord-a", ttl_s=10.0)
        assert a.acquire(timeout=5.0)
        store = Store(sync_client, keys, a, max_txn_ops=16, max_txns_in_flight=4)
        for n in range(8):
            store.put_node(make_node(f"n{n}"))
        tasks = stored_tasks(store, 48, make_task)
        depose(a)
        with pytest.raises(Fenced):
            store.commit_placements([(t, t.revision, make_allocation(f"n{i % 8}", [i // 8]))
                                     for i, t in enumerate(tasks)])
        assert not a.is_leader
        assert all(store.get_task(t.id).state == S.PENDING for t in tasks)
        assert all(store.get_allocation(t.id) is None for t in tasks)


class _LosesAnswers:
    """A real etcd client whose next ``lose`` transactions each raise EtcdUnavailable as a timeout would: after
    etcd applied them (``applied=True``: the answer is lost) or without sending them (the request is lost)."""

    def __init__(self, client: EtcdClient) -> None:
        self._client = client
        self.lose = 0
        self.applied = True

    def __getattr__(self, name: str) -> object:
        return getattr(self._client, name)

    def txn(self, *args: object, **kwargs: object) -> object:
        if self.lose <= 0:
            return self._client.txn(*args, **kwargs)  # type: ignore[arg-type]
        self.lose -= 1
        if self.applied:
            self._client.txn(*args, **kwargs)  # type: ignore[arg-type]
        raise EtcdUnavailable("etcd did not answer in time (test)")


class TestLostAnswers:
    """A placement whose answer is lost keeps its GPUs taken until a later commit settles it."""

    @pytest.mark.parametrize("applied", [True, False], ids=["answer lost", "request lost"])
    def test_a_lost_placement_is_settled_before_its_gpus_are_placed_again(
        self, sync_client: EtcdClient, keys: Keys, leader: Election, make_node: Callable, make_task: Callable,
        make_allocation: Callable, applied: bool,
    ) -> None:
        """Task A's placement on GPU 0 gets no answer. The next commit, of task B on GPU 0 with holdings that know
        nothing of A, first settles A: when A's placement was applied it is handed back as recovered and B is
        refused; when it was not, A's record is rewritten (so the lost request can never apply) and B commits.
        Either way GPU 0 is held once."""
        lossy = _LosesAnswers(sync_client)
        store = Store(lossy, keys, leader)  # type: ignore[arg-type]
        store.put_node(make_node("n1"))
        a, b = stored_tasks(store, 2, make_task)
        lossy.lose, lossy.applied = 1, applied
        first = store.commit_placements([(a, a.revision, make_allocation("n1", [0]))])
        assert isinstance(first.rejected[a.id], EtcdUnavailable) and not first.committed
        nothing = LeaderState(NodeRegistry(1.0, 10.0))   # holdings as the leader has them: A unknown
        second = store.commit_placements([(b, b.revision, make_allocation("n1", [0]))],
                                         nothing.holdings.reservation_on)
        if applied:
            assert set(second.recovered) == {a.id} and second.recovered[a.id].state == S.SCHEDULED
            assert isinstance(second.rejected[b.id], Conflict) and not second.committed
            assert store.get_allocation(a.id) is not None and store.get_allocation(b.id) is None
        else:
            assert not second.recovered and set(second.committed) == {b.id}
            assert store.get_allocation(a.id) is None and store.get_task(a.id).state == S.PENDING
        assert held_gpus(store) == {"n1": [0]}

    def test_gpus_stay_taken_while_etcd_does_not_answer(
        self, sync_client: EtcdClient, keys: Keys, leader: Election, make_node: Callable, make_task: Callable,
        make_allocation: Callable,
    ) -> None:
        """While the lost placement cannot be settled (etcd keeps not answering it), its GPU is refused to others;
        once etcd answers, it is settled and held once."""
        lossy = _LosesAnswers(sync_client)
        store = Store(lossy, keys, leader)  # type: ignore[arg-type]
        store.put_node(make_node("n1"))
        a, b = stored_tasks(store, 2, make_task)
        lossy.lose = 2   # the placement, then the settling write of the next commit
        store.commit_placements([(a, a.revision, make_allocation("n1", [0]))])
        second = store.commit_placements([(b, b.revision, make_allocation("n1", [0, 1]))])
        assert isinstance(second.rejected[b.id], Conflict) and "GPU 0" in str(second.rejected[b.id])
        third = store.commit_placements([])
        assert set(third.recovered) == {a.id}
        assert held_gpus(store) == {"n1": [0]}
