"""Benchmark: placements committed per second through etcd, batched vs one per transaction.

Run: ``.venv/bin/python tests/bench/bench_sync.py [--placements 1024] [--nodes 128]``. It starts
its own single-member embedded etcd in a temporary directory, wins the election, stores the
nodes and PENDING tasks, then times ``Store.commit_placements`` over the same kind of
placements twice: with etcd's default op limit (many placements per transaction) and with
an op limit that fits one placement per transaction. Each run uses a fresh key prefix.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere in the checkout

from common.etcd_embedded import EmbeddedEtcd
from common.logging import configure_logging
from common.pb.gptrm.v1 import types_pb2
from coordinator.sync import CommitResult, Election, EtcdClient, Keys, Store, connect

GPUS_PER_NODE = 8
ONE_PER_TXN_OPS = 5
"""1 fencing + 2 per placement + 1 node = 4 compares fit; a second placement (7) does not."""


def prepare(client: EtcdClient, prefix: str, nodes: int, count: int, max_ops: int) -> tuple[Store, Election, list]:
    """Win the election under ``prefix`` and store ``nodes`` nodes and ``count`` PENDING tasks."""
    keys = Keys(prefix)
    election = Election(client, keys, "bench", "bench:7070", ttl_s=5.0)
    if not election.acquire(timeout=10.0):
        raise SystemExit("bench: did not win the election")
    store = Store(client, keys, election, max_txn_ops=max_ops)
    for n in range(nodes):
        inventory = types_pb2.NodeInventory(node_id=f"n{n}", hostname=f"n{n}")
        store.put_node(types_pb2.NodeRecord(inventory=inventory, state=types_pb2.NODE_STATE_READY))
    placements = []
    demand = types_pb2.ResourceVector(gpus=1, cpu_cores=8, mem_bytes=64 << 30)
    for i in range(count):
        task = store.create_task(types_pb2.Task(spec=types_pb2.TaskSpec(name=f"job-{i}", argv=["train"])))
        # Spread over the nodes as a scheduler would: task i takes GPU i // nodes on node i % nodes.
        na = types_pb2.NodeAllocation(node_id=f"n{i % nodes}", gpu_indices=[i // nodes], demand=demand, gpu_share=1)
        placements.append((task, task.revision, types_pb2.Allocation(nodes=[na], decision_id=f"d-{i}")))
    return store, election, placements


def run(client: EtcdClient, prefix: str, nodes: int, count: int, max_ops: int) -> tuple[CommitResult, float]:
    """Commit ``count`` placements with the given op limit; returns the result and the seconds taken."""
    store, election, placements = prepare(client, prefix, nodes, count, max_ops)
    try:
        started = time.perf_counter()
        result = store.commit_placements(placements)
        elapsed = time.perf_counter() - started
    finally:
        election.resign()
    if len(result.committed) != count:
        raise SystemExit(f"bench: only {len(result.committed)} of {count} placements committed: {result.rejected}")
    return result, elapsed


def main() -> None:
    """Parse flags, run both modes, print them side by side."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--placements", type=int, default=1024)
    parser.add_argument("--nodes", type=int, default=128)
    args = parser.parse_args()
    if args.placements > args.nodes * GPUS_PER_NODE:
        parser.error(f"--placements must be at most nodes × {GPUS_PER_NODE}")
    configure_logging("warning")
    with tempfile.TemporaryDirectory(prefix="gptrm-bench-etcd-") as tmp, EmbeddedEtcd(Path(tmp)) as etcd:
        client = connect(etcd.endpoints, timeout_s=10.0)
        try:
            rows = [
                ("batched (max 128 ops/txn)", *run(client, "/bench/batched/", args.nodes, args.placements, 128)),
                ("one per transaction", *run(client, "/bench/single/", args.nodes, args.placements, ONE_PER_TXN_OPS)),
            ]
        finally:
            client.close()
    print(f"commit_placements: {args.placements} placements over {args.nodes} nodes, single-member embedded etcd")
    print(f"{'mode':<28}{'transactions':>14}{'seconds':>10}{'placements/s':>14}")
    for mode, result, seconds in rows:
        print(f"{mode:<28}{result.transactions:>14}{seconds:>10.3f}{args.placements / seconds:>14.0f}")
    speedup = rows[1][2] / rows[0][2]
    print(f"batched is {speedup:.1f}x faster")


if __name__ == "__main__":
    main()
