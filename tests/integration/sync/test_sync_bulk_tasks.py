"""Many tasks written at once (an array's elements): created and cancelled in few transactions, each bounded by
etcd's operation limit, nothing of a transaction half-applied (coordinator/sync/store.py)."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from common.pb.gptrm.v1 import types_pb2
from common.types import TaskState
from coordinator.sync import Election, EtcdClient, Keys, Store
from coordinator.sync.state_machine import Conflict

OPS = 10   # a small --max-txn-ops, so that a few dozen tasks need several transactions


def _tasks(make_task: Callable[..., types_pb2.Task], n: int, first: int = 0) -> list[types_pb2.Task]:
    out = []
    for i in range(first, first + n):
        t = make_task(f"e{i}")
        t.id = f"a-0123456789ab_{i}"
        out.append(t)
    return out


class TestBulkTasks:
    def test_created_in_batches_under_the_op_limit(self, sync_client: EtcdClient, keys: Keys, leader: Election,
                                                   make_task: Callable) -> None:
        store = Store(sync_client, keys, leader, max_txn_ops=OPS)
        stored = store.create_tasks(_tasks(make_task, 50))
        # one etcd revision per transaction (counted on the tasks themselves: other writers share the etcd)
        assert len({t.revision for t in stored}) == math.ceil(50 / (OPS - 1))
        assert [t.id for t in stored] == [f"a-0123456789ab_{i}" for i in range(50)]
        again = store.get_task("a-0123456789ab_49")
        assert again.state == TaskState.PENDING and again.revision == stored[-1].revision
        assert [h.state for h in again.history] == [TaskState.PENDING]

    def test_a_batch_with_an_existing_task_writes_nothing(self, sync_client: EtcdClient, keys: Keys,
                                                          leader: Election, make_task: Callable) -> None:
        store = Store(sync_client, keys, leader, max_txn_ops=OPS)
        store.create_tasks(_tasks(make_task, 1, first=5))
        with pytest.raises(Conflict):
            store.create_tasks(_tasks(make_task, 9))   # one transaction: 0..8, 5 among them
        assert [kv.key for kv in sync_client.range_prefix(keys.tasks_prefix)[0]] == [keys.task("a-0123456789ab_5")]

    def test_cancelled_in_batches_a_changed_one_keeps_its_batch_out(self, sync_client: EtcdClient, keys: Keys,
                                                                    leader: Election, make_task: Callable) -> None:
        store = Store(sync_client, keys, leader, max_txn_ops=OPS)
        stored = store.create_tasks(_tasks(make_task, 20))
        store.update_task(stored[3].id, stored[3].revision, log_tail="changed")   # its copy below is stale
        cancelled = store.cancel_unplaced(stored, "cancelled by an admin")
        # batch 0..8 refused; 9..17 and 18..19 written, one transaction each (one revision each)
        assert [t.id for t in cancelled] == [t.id for t in stored[9:]]
        assert len({store.get_task(t.id).revision for t in cancelled}) == 2
        assert store.get_task(stored[3].id).state == TaskState.PENDING
        assert store.get_task(stored[0].id).state == TaskState.PENDING   # same batch: nothing of it written
        done = store.get_task(stored[12].id)
        assert done.state == TaskState.CANCELLED and done.reason == "cancelled by an admin"
        assert [h.state for h in done.history] == [TaskState.PENDING, TaskState.CANCELLED]
