"""commit_placements against a real etcd: batching under etcd's op limit, stale tasks, reservations."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

from common.errors import Fenced, IllegalTransition, NotFound
from common.pb.gptrm.v1 import types_pb2
from common.types import TaskState
from coordinator.monitor.nodes import NodeRegistry
from coordinator.state import LeaderState
from coordinator.sync import Conflict, Election, EtcdClient, Keys, Store

S = TaskState


def stored_tasks(store: Store, count: int, make_task: Callable) -> list[types_pb2.Task]:
    """``count`` fresh PENDING tasks."""
    return [store.create_task(make_task(f"job-{i}")) for i in range(count)]


class TestCommitPlacements:
    """commit_placements(): batches, fallback, atomic node reservations."""

    def test_many_placements_split_into_transactions_within_128_ops(
        self, store: Store, make_node: Callable, make_task: Callable, make_allocation: Callable
    ) -> None:
        """100 placements on 10 nodes commit in 2 transactions and every reservation adds up."""
        for n in range(10):
            store.put_node(make_node(f"n{n}", gpus=10))
        tasks = stored_tasks(store, 100, make_task)
        placements = [(t, t.revision, make_allocation(f"n{i % 10}", [i // 10])) for i, t in enumerate(tasks)]
        result = store.commit_placements(placements)
        # Compares per batch: 1 fencing + 2 per placement + 1 per node ≤ 128, so with all 10 nodes in
        # every batch a batch holds at most (128 - 1 - 10) // 2 = 58 placements: 58 + 42 → 2 transactions.
        assert result.rejected == {}
        assert set(result.committed) == {t.id for t in tasks}
        assert result.transactions == 2
        state = store.load_all()
        assert all(state.tasks[t.id].state == S.SCHEDULED for t in tasks)
        assert set(state.allocations) == {t.id for t in tasks}
        for n in range(10):
            record = state.nodes[f"n{n}"]
            assert list(record.reserved_gpu_indices) == list(range(10))
            assert record.reserved.gpus == 10 and record.reserved.mem_bytes == 10 * (32 << 30)
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
        assert list(small.get_node("n1").reserved_gpu_indices) == list(range(30))

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
        node = store.get_node("n1")
        assert list(node.reserved_gpu_indices) == [i for i in range(20) if i != 7]  # only committed ones
        assert store.get_allocation(stale.id) is None
        assert store.get_task(stale.id).state == S.PENDING

    def test_taken_gpu_missing_node_and_wrong_state_are_rejected(
        self, store: Store, make_node: Callable, make_task: Callable, make_allocation: Callable
    ) -> None:
        """A GPU already reserved, a node without record and a non-PENDING task are each rejected with a reason."""
        store.put_node(make_node("n1"))
        a, b, c, d = stored_tasks(store, 4, make_task)
        d = store.transition(d.id, d.revision, S.CANCELLED, "user")
        result = store.commit_placements(
            [
                (a, a.revision, make_allocation("n1", [0, 1])),
                (b, b.revision, make_allocation("n1", [1, 2])),  # GPU 1 is a's
                (c, c.revision, make_allocation("ghost", [0])),
                (d, d.revision, make_allocation("n1", [5])),
            ]
        )
        assert set(result.committed) == {a.id}
        assert isinstance(result.rejected[b.id], Conflict) and "GPU 1 already reserved" in str(result.rejected[b.id])
        assert isinstance(result.rejected[c.id], NotFound) and "'ghost'" in str(result.rejected[c.id])
        assert isinstance(result.rejected[d.id], IllegalTransition)
        assert list(store.get_node("n1").reserved_gpu_indices) == [0, 1]

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
        node = store.get_node("n1")
        assert list(node.reserved_gpu_indices) == [3, 3] and node.reserved.gpus == pytest.approx(1.0)
        assert store.release_allocation(a.id) is True
        node = store.get_node("n1")
        assert list(node.reserved_gpu_indices) == [3] and node.reserved.gpus == pytest.approx(0.5)

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
        """Releasing frees the reservation and deletes the allocation; a second release finds nothing."""
        store.put_node(make_node("n1"))
        (task,) = stored_tasks(store, 1, make_task)
        store.commit_placements([(task, task.revision, make_allocation("n1", [0, 1, 2]))])
        assert store.release_allocation(task.id) is True
        node = store.get_node("n1")
        assert list(node.reserved_gpu_indices) == [] and node.reserved.gpus == 0 and node.reserved.mem_bytes == 0
        assert store.release_allocation(task.id) is False


def reserved_from_allocations(store: Store, tasks: list[types_pb2.Task]) -> dict[str, list[int]]:
    """node id → the GPU indices the stored allocations of ``tasks`` hold there (sorted multiset)."""
    out: dict[str, list[int]] = {}
    for t in tasks:
        alloc = store.get_allocation(t.id)
        for na in alloc.nodes if alloc is not None else ():
            out.setdefault(na.node_id, []).extend(na.gpu_indices)
    return {n: sorted(v) for n, v in out.items()}


class TestPipelinedCommits:
    """Several batches in flight: node-disjoint, each fenced, each placement all or nothing."""

    def test_many_batches_in_flight_commit_everything_once(
        self, sync_client: EtcdClient, keys: Keys, leader: Election, make_node: Callable, make_task: Callable,
        make_allocation: Callable,
    ) -> None:
        """240 placements over 12 nodes in shuffled order, 4 transactions in flight: each node's record is written
        by one transaction, every reservation adds up, and a new leader's read finds exactly what committed."""
        store = Store(sync_client, keys, leader, max_txn_ops=64, max_txns_in_flight=4)
        for n in range(12):
            store.put_node(make_node(f"n{n}", gpus=20))
        tasks = stored_tasks(store, 240, make_task)
        mine, theirs = NodeRegistry(heartbeat_interval_s=1.0, lost_grace_s=10.0), NodeRegistry(1.0, 10.0)
        leading = LeaderState(mine)
        leading.adopt({t.id: t for t in tasks}, {n.inventory.node_id: n for n in store.list_nodes()})
        placements = [(t, t.revision, make_allocation(f"n{i % 12}", [i // 12])) for i, t in enumerate(tasks)]
        result = store.commit_placements(placements[::-1])
        assert result.rejected == {} and len(result.committed) == 240
        # 20 placements per node take 1 + 40 + 1 = 42 compares: one node per transaction of ≤ 64.
        assert result.transactions == 12
        for stored in result.stored.values():
            leading.apply_placement(stored)
        state = store.load_all()
        for n in range(12):
            assert list(state.nodes[f"n{n}"].reserved_gpu_indices) == list(range(20))
        assert {tid: t.revision for tid, t in state.tasks.items()} == result.committed
        assert all(state.tasks[tid] == stored for tid, stored in result.stored.items())
        # A new leader's view read from etcd is the one the leader built in memory from the commit's answer.
        recovered = LeaderState(theirs)
        recovered.adopt(state.tasks, state.nodes)
        assert dict(recovered.tasks) == dict(leading.tasks)
        for n in range(12):
            a, b = mine.get(f"n{n}"), theirs.get(f"n{n}")
            assert a is not None and b is not None
            assert a.record.reserved == b.record.reserved == state.nodes[f"n{n}"].reserved
            assert list(a.record.reserved_gpu_indices) == list(b.record.reserved_gpu_indices)
            assert a.task_ids == b.task_ids and len(a.task_ids) == 20

    def test_one_failed_compare_leaves_nothing_and_the_rest_commit(
        self, sync_client: EtcdClient, keys: Keys, leader: Election, make_node: Callable, make_task: Callable,
        make_allocation: Callable,
    ) -> None:
        """In one of several batches in flight a task changed meanwhile: that placement leaves no task state, no
        allocation and no reservation behind; every other placement, in its batch and in the others, commits."""
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
        assert list(store.get_node("n5").reserved_gpu_indices) == [0, 1, 3, 4, 5, 6, 7, 8, 9]
        assert {n.inventory.node_id: sorted(n.reserved_gpu_indices) for n in store.list_nodes()} == \
            reserved_from_allocations(store, tasks)

    def test_a_node_shared_with_a_failed_batch_is_read_again(
        self, sync_client: EtcdClient, keys: Keys, leader: Election, make_node: Callable, make_task: Callable,
        make_allocation: Callable,
    ) -> None:
        """30 placements on one node take 4 transactions of ≤ 9; the first one fails on a stale task, so its
        placements go one per transaction and change the node's record: the next batch reads the record again
        instead of comparing against the revision it had, and commits at once."""
        store = Store(sync_client, keys, leader, max_txn_ops=20, max_txns_in_flight=4)
        store.put_node(make_node("n1", gpus=30))
        tasks = stored_tasks(store, 30, make_task)
        stale = tasks[4]
        store.update_task(stale.id, stale.revision, log_tail="touched by someone else")
        result = store.commit_placements([(t, t.revision, make_allocation("n1", [i])) for i, t in enumerate(tasks)])
        assert set(result.rejected) == {stale.id} and len(result.committed) == 29
        assert result.transactions == 8 + 3   # the failed batch's 8 others one by one, then 9 + 9 + 3
        assert list(store.get_node("n1").reserved_gpu_indices) == [i for i in range(30) if i != 4]

    def test_concurrent_commits_never_reserve_a_gpu_twice(
        self, sync_client: EtcdClient, client_factory: Callable[[], EtcdClient], keys: Keys, leader: Election,
        make_node: Callable, make_task: Callable, make_allocation: Callable,
    ) -> None:
        """Two commits at once (each pipelined, on its own connection) ask for the same whole GPUs of the same
        nodes for different tasks, while node records are rewritten as a heartbeat would: each GPU goes to one
        task, and every node's reservation is exactly the sum of the allocations stored."""
        stores = [Store(c, keys, leader, max_txn_ops=24, max_txns_in_flight=4)
                  for c in (sync_client, client_factory())]
        for n in range(4):
            stores[0].put_node(make_node(f"n{n}", gpus=16))
        groups = [stored_tasks(s, 64, make_task) for s in stores]
        stop = threading.Event()

        def heartbeats() -> None:
            while not stop.is_set():
                for n in range(4):
                    # Keeps the reservations, bumps the revision; a Conflict (the commits kept changing the
                    # record for 5 tries) waits for the next round.
                    with contextlib.suppress(Conflict):
                        stores[0].put_node(make_node(f"n{n}", gpus=16))

        beating = threading.Thread(target=heartbeats)
        beating.start()
        try:
            with ThreadPoolExecutor(2) as pool:
                futures = [pool.submit(s.commit_placements,
                                       [(t, t.revision, make_allocation(f"n{i % 4}", [i // 4])) for i, t in
                                        enumerate(group)])
                           for s, group in zip(stores, groups, strict=True)]
                results = [f.result() for f in futures]
        finally:
            stop.set()
            beating.join()
        committed = {tid for r in results for tid in r.committed}
        everything = groups[0] + groups[1]
        held = reserved_from_allocations(stores[0], everything)
        for n in range(4):
            assert held.get(f"n{n}", []) == sorted(set(held.get(f"n{n}", [])))   # no GPU held twice
        assert {n.inventory.node_id: sorted(n.reserved_gpu_indices) for n in stores[0].list_nodes()} == \
            {f"n{n}": held.get(f"n{n}", []) for n in range(4)}
        assert len(committed) == sum(len(v) for v in held.values()) >= 64
        for r in results:
            assert all(isinstance(e, Conflict) for e in r.rejected.values())
            assert len(r.committed) + len(r.rejected) == 64
        for t in everything:
            stored = stores[0].get_task(t.id)
            assert (stored.state == S.SCHEDULED) == (t.id in committed)

    def test_deposed_leader_commits_nothing(
        self, make_election: Callable, sync_client: EtcdClient, client_factory: Callable[[], EtcdClient],
        keys: Keys, make_node: Callable, make_task: Callable, make_allocation: Callable,
    ) -> None:
        """A leader deposed without noticing it sends its batches (several in flight): every one is fenced, the
        call raises Fenced, the leader steps down, and etcd holds no placement of it."""
        a = make_election("coord-a", ttl_s=10.0)
        assert a.acquire(timeout=5.0)
        store = Store(sync_client, keys, a, max_txn_ops=16, max_txns_in_flight=4)
        for n in range(8):
            store.put_node(make_node(f"n{n}"))
        tasks = stored_tasks(store, 48, make_task)
        client_factory().revoke_lease(a.lease_id)  # type: ignore[arg-type]  # as if A's lease expired
        b = make_election("coord-b", client=client_factory())
        b.start()
        assert b.wait_for_leadership(timeout=3.0)
        assert a.is_leader   # A has not noticed: only fencing stands between it and the data
        with pytest.raises(Fenced):
            store.commit_placements([(t, t.revision, make_allocation(f"n{i % 8}", [i // 8]))
                                     for i, t in enumerate(tasks)])
        assert not a.is_leader
        assert all(store.get_task(t.id).state == S.PENDING for t in tasks)
        assert all(store.get_allocation(t.id) is None for t in tasks)
        assert all(not n.reserved_gpu_indices and not n.reserved.gpus for n in store.list_nodes())
