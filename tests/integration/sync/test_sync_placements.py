"""commit_placements against a real etcd: batching under etcd's op limit, stale tasks, reservations."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from common.errors import IllegalTransition, NotFound
from common.pb.gptrm.v1 import types_pb2
from common.types import TaskState
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
