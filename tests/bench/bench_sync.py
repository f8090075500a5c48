"""Benchmark: placements committed per second through etcd, batched vs one per transaction.

Run: ``.venv/bin/python tests/bench/bench_sync.py [--placements 1024] [--nodes 128] [--rounds 5]``.
It starts its own single-member embedded etcd in a temporary directory and, per mode, wins the
election through a :class:`~coordinator.sync.Leadership` (as a coordinator does), stores the
nodes and PENDING tasks, loads them into a :class:`~coordinator.state.LeaderState`, then times
what the scheduling cycle does from decision to committed (``SchedulerCycle._commit``):
``leadership.write(store.commit_placements, commits)`` (the store builds the fenced
transactions in the write thread) and then ``apply_placement`` of every stored task into the
leader's memory. Two modes, the same kind of placements: etcd's default op limit (many
placements per transaction) and an op limit that fits one placement per transaction. Each
round uses fresh key prefixes; the best round of each mode is printed (the figure the machine
can do when nothing else runs), with the slowest beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere in the checkout

from common.logging import configure_logging
from common.pb.gptrm.v1 import types_pb2
from coordinator.etcd_embedded import EmbeddedEtcd
from coordinator.events import EventBus
from coordinator.monitor.nodes import NodeRegistry
from coordinator.state import LeaderState
from coordinator.sync import CommitResult, EtcdClient, Keys, Leadership, Store, connect
from tests.helpers.roles import IdleRole

GPUS_PER_NODE = 8
ONE_PER_TXN_OPS = 5
"""1 fencing + 2 per placement + 1 node = 4 compares fit; a second placement (7) does not."""


async def _lead(client: EtcdClient, keys: Keys) -> Leadership:
    leadership = Leadership(client, keys, "bench", "bench:7070", ttl_s=5.0, events=EventBus())
    leadership.start(IdleRole(), asyncio.get_running_loop())
    deadline = time.monotonic() + 10.0
    while not leadership.is_leader:
        if time.monotonic() > deadline:
            raise SystemExit("bench: did not win the election")
        await asyncio.sleep(0.01)
    return leadership


async def run(client: EtcdClient, prefix: str, nodes: int, count: int, max_ops: int) -> tuple[CommitResult, float]:
    """Commit ``count`` placements with the given op limit, decision to leader memory; returns the result and
    the seconds taken."""
    keys = Keys(prefix)
    leadership = await _lead(client, keys)
    try:
        store = Store(client, keys, leadership.election, max_txn_ops=max_ops)
        registry = NodeRegistry(heartbeat_interval_s=1.0, lost_grace_s=10.0)
        state = LeaderState(registry)
        for n in range(nodes):
            inventory = types_pb2.NodeInventory(node_id=f"n{n}", hostname=f"n{n}")
            registry.load(store.put_node(types_pb2.NodeRecord(inventory=inventory, state=types_pb2.NODE_STATE_READY)))
        commits = []
        demand = types_pb2.ResourceVector(gpus=1, cpu_cores=8, mem_bytes=64 << 30)
        for i in range(count):
            task = store.create_task(types_pb2.Task(spec=types_pb2.TaskSpec(name=f"job-{i}", argv=["train"])))
            state.apply_task(task)
            # Spread over the nodes as a scheduler would: task i takes GPU i // nodes on node i % nodes.
            na = types_pb2.NodeAllocation(node_id=f"n{i % nodes}", gpu_indices=[i // nodes], demand=demand,
                                          gpu_share=1)
            commits.append((task, task.revision, types_pb2.Allocation(nodes=[na], decision_id=f"d-{i}")))
        started = time.perf_counter()
        result = await leadership.write(store.commit_placements, commits)
        for task, _rev, _alloc in commits:
            if task.id in result.committed:
                state.apply_placement(result.stored[task.id])
        elapsed = time.perf_counter() - started
    finally:
        await leadership.resign()
    if len(result.committed) != count:
        raise SystemExit(f"bench: only {len(result.committed)} of {count} placements committed: {result.rejected}")
    held = sum(len(e.task_ids) for e in registry)
    if held != count:
        raise SystemExit(f"bench: the leader's memory holds {held} placements, not {count}")
    return result, elapsed


async def main_async(args: argparse.Namespace) -> list[tuple[str, int, list[float]]]:
    modes = [("batched (max 128 ops/txn)", "batched", 128), ("one per transaction", "single", ONE_PER_TXN_OPS)]
    rows: dict[str, tuple[int, list[float]]] = {}
    with tempfile.TemporaryDirectory(prefix="gptrm-bench-etcd-") as tmp, EmbeddedEtcd(Path(tmp)) as etcd:
        client = connect(etcd.endpoints, timeout_s=10.0)
        try:
            for r in range(args.rounds):
                for label, name, max_ops in modes:   # the modes alternate, so both see the same machine
                    result, seconds = await run(client, f"/bench/{name}-{r}/", args.nodes, args.placements, max_ops)
                    rows.setdefault(label, (result.transactions, []))[1].append(seconds)
        finally:
            client.close()
    return [(label, txns, times) for label, (txns, times) in rows.items()]


def main() -> None:
    """Parse flags, run both modes, print them side by side."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--placements", type=int, default=1024)
    parser.add_argument("--nodes", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if args.placements > args.nodes * GPUS_PER_NODE:
        parser.error(f"--placements must be at most nodes × {GPUS_PER_NODE}")
    configure_logging("error")   # a resign logs leadership_lost as a warning
    rows = asyncio.run(main_async(args))
    print(f"placements committed, decision → etcd → leader memory: {args.placements} placements over "
          f"{args.nodes} nodes, single-member embedded etcd, best (slowest) of {args.rounds} rounds")
    print(f"{'mode':<28}{'transactions':>14}{'seconds':>10}{'placements/s':>20}")
    for mode, txns, times in rows:
        best, worst = min(times), max(times)
        rate = f"{args.placements / best:.0f} ({args.placements / worst:.0f})"
        print(f"{mode:<28}{txns:>14}{best:>10.3f}{rate:>20}")
    speedup = min(rows[1][2]) / min(rows[0][2])
    print(f"batched is {speedup:.1f}x faster")


if __name__ == "__main__":
    main()
