"""Packing placements into transactions (pure; no etcd): etcd's limits, in order, no node record counted."""

from __future__ import annotations

from common.pb.gptrm.v1 import types_pb2
from common.types import TaskState
from coordinator.sync._records import Prepared, batches, prepare_placement


def placement(i: int, *node_ids: str) -> Prepared:
    task = types_pb2.Task(id=f"t-{i}", state=int(TaskState.PENDING))
    alloc = types_pb2.Allocation(nodes=[types_pb2.NodeAllocation(node_id=n, gpu_indices=[i]) for n in node_ids])
    return prepare_placement(task, 7, alloc, epoch=1, now_unix_s=1.0, history_limit=10)


def compares(batch: list[Prepared]) -> int:
    """What etcd counts against --max-txn-ops: 1 fencing + 2 per placement (task revision, allocation absent)."""
    return 1 + 2 * len(batch)


class TestBatches:
    def test_transactions_fill_up_to_the_op_limit_in_order(self) -> None:
        """8 placements per node, 16 nodes: 63 placements per transaction (1 + 126 compares), nodes mixed
        freely (no node record is written, so sharing a node costs nothing)."""
        prepared = [placement(i, f"n{n:02}") for n in range(16) for i in range(8)]
        out = list(batches(prepared, 128, 1 << 20))
        assert [len(b) for b in out] == [63, 63, 2]
        assert all(compares(b) <= 128 for b in out)
        assert [p for b in out for p in b] == prepared   # nothing lost, order kept

    def test_a_small_op_limit_splits(self) -> None:
        """30 placements with room for 9 per transaction: 9 + 9 + 9 + 3."""
        prepared = [placement(i, "n1") for i in range(30)]
        out = list(batches(prepared, 20, 1 << 20))
        assert [len(b) for b in out] == [9, 9, 9, 3]
        assert all(compares(b) <= 20 for b in out)

    def test_the_byte_budget_splits_as_well_as_the_op_limit(self) -> None:
        """A gang's placement counts its bytes once, whatever its node count; a placement too big alone goes alone."""
        prepared = [placement(0, "a", "b"), placement(1, "a", "b"), placement(2, "c")]
        assert [len(b) for b in batches(prepared, 128, 1 << 20)] == [3]
        size = len(prepared[0].task_bytes) + len(prepared[0].allocation_bytes)
        assert [len(b) for b in batches(prepared, 128, size)] == [1, 1, 1]
        assert [len(b) for b in batches(prepared, 128, 1)] == [1, 1, 1]
