"""Packing placements into transactions (pure; no etcd): etcd's limits, and a node's placements kept together."""

from __future__ import annotations

from common.pb.gptrm.v1 import types_pb2
from common.types import TaskState
from coordinator.sync._records import Prepared, batches, prepare_placement


def placement(i: int, *node_ids: str) -> Prepared:
    task = types_pb2.Task(id=f"t-{i}", state=int(TaskState.PENDING))
    alloc = types_pb2.Allocation(nodes=[types_pb2.NodeAllocation(node_id=n, gpu_indices=[i]) for n in node_ids])
    return prepare_placement(task, 7, alloc, epoch=1, now_unix_s=1.0, history_limit=10)


def compares(batch: list[Prepared]) -> int:
    """What etcd counts against --max-txn-ops: 1 fencing + 2 per placement + 1 per node."""
    return 1 + 2 * len(batch) + len({n for p in batch for n in p.node_ids})


def nodes_of(batch: list[Prepared]) -> set[str]:
    return {n for p in batch for n in p.node_ids}


class TestBatches:
    def test_a_node_s_placements_stay_in_one_transaction(self) -> None:
        """8 placements per node, 16 nodes, in node order: each transaction takes whole nodes (7 × 8 placements =
        120 compares), so no node record is written by two transactions."""
        prepared = [placement(i, f"n{n:02}") for n in range(16) for i in range(8)]
        out = list(batches(prepared, 128, 1 << 20))
        assert [len(b) for b in out] == [56, 56, 16]
        assert all(compares(b) <= 128 for b in out)
        assert [p for b in out for p in b] == prepared   # nothing lost, order kept
        for a in range(len(out)):
            for b in range(a + 1, len(out)):
                assert not nodes_of(out[a]) & nodes_of(out[b])

    def test_a_run_too_big_for_one_transaction_is_split(self) -> None:
        """30 placements on one node with room for 9 per transaction: 9 + 9 + 9 + 3."""
        prepared = [placement(i, "n1") for i in range(30)]
        out = list(batches(prepared, 20, 1 << 20))
        assert [len(b) for b in out] == [9, 9, 9, 3]
        assert all(compares(b) <= 20 for b in out)

    def test_runs_fill_a_transaction_before_a_new_one(self) -> None:
        """Runs that fit together share a transaction; a run that does not fit goes whole into the next."""
        prepared = [placement(i, "a") for i in range(3)] + [placement(i, "b") for i in range(3)]
        assert [len(b) for b in batches(prepared, 15, 1 << 20)] == [6]      # 1 + 12 + 2 = 15
        assert [len(b) for b in batches(prepared, 14, 1 << 20)] == [3, 3]   # b's run does not fit: whole next

    def test_gangs_count_every_node(self) -> None:
        """A two-node placement counts both nodes, and the byte budget splits as well as the op limit."""
        prepared = [placement(0, "a", "b"), placement(1, "a", "b"), placement(2, "c")]
        assert [len(b) for b in batches(prepared, 128, 1 << 20)] == [3]
        size = len(prepared[0].task_bytes) + len(prepared[0].allocation_bytes)
        assert [len(b) for b in batches(prepared, 128, size + 2 * 4096)] == [1, 1, 1]
