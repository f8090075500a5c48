"""Placement throughput: 10,000 queued requests on 5,000 nodes, per policy, production vs reference.

Run with ``.venv/bin/python tests/bench/bench_scheduler.py [--nodes N] [--requests N] [--seed S]
[--threshold-mode whole-gpus|paper]`` (the engine's default mode unless given; the reference
always applies the paper's rule). ``--topology hgx|pcie-nvlink-pairs`` gives every node a GPU
topology of that kind (the allocator then walks its islands); ``--racks N`` labels the nodes with N
``rack`` values and places gangs by them. ``--expected-runs`` gives every request an expected run
time (time-aware then orders by expected ends; without one it ranks like Alg. 1), one of four by
default, of ``--run-times N`` drawn ones, or drawn per request with ``--run-times 0``.

The cluster mixes H100/A100/L4 nodes, a third of them partly busy. The queue is drawn from a
catalogue of task shapes such as the profiler produces (shared inference slices, 1-8 GPU
inference and fine-tuning, 8-GPU training gangs), sized so that the queue asks for more than
the cluster has: the first part of every run places, the tail is refused. Each row gives the
overall rate and, separately, the placed and the refused decisions' rates, because the two
cost very different amounts.

Rates are decisions per CPU second of this process (``time.process_time``), so other work on a
shared machine does not count against them; the engine is single-threaded. ``decisions/s`` is one
leader cycle on the placement state kept across cycles
(:class:`~coordinator.scheduler.placement.live.LivePlacement`): bringing it to the cycle's snapshot
(the nodes the previous batch reserved on, compared with the state and found equal, as once the
leader stored those placements, and ``--changed`` nodes, 1 % by default, with a new power curve,
applied), then one ``place_batch`` over the whole queue; the fastest of ``--repeat`` cycles
(:func:`time_live`; ``compared`` and ``applied`` count the nodes of that cycle's update).
``rebuilt/s`` is the same batch on an engine built from the snapshot, construction included, the
fastest of ``--repeat`` runs. The placed/refused columns time each ``place`` call of one separate
run on a fresh engine, so they leave out the batch's sort and garbage-collector pause. Building the
snapshot itself from the leader's tables (:class:`~coordinator.scheduler.snapshot.SnapshotBuilder`)
is not timed here: the bench starts from a ``ClusterSnapshot``.

The literal reference (tests/helpers/reference_algorithms.py) sorts every node per
request in Python; it is timed on the first ``--reference-requests`` requests of the same queue
on the same cluster and its rate is extrapolated from that subset (as the output says).
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import sys
import time
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from dataclasses import replace  # noqa: E402

from common.topology import simulated_topology, topology_from_facts  # noqa: E402
from coordinator.domain import ClusterSnapshot, GpuSlot, NodeSnapshot, Placement, PowerCurve, Request, Resources  # noqa: E402
from coordinator.scheduler.placement.engine import PlacementEngine  # noqa: E402
from coordinator.scheduler.placement.live import LivePlacement  # noqa: E402
from coordinator.scheduler.policies import POLICIES  # noqa: E402

GIB = 1024**3
TARGET_RATE = 20_000  # decisions/s per leader cycle (state update included) for 10,000 requests
EXPECTED_RUNS_S = (600.0, 3600.0, 4 * 3600.0, 24 * 3600.0)   # --expected-runs draws from these
# (gpus, GPU model, GiB per GPU, idle W, max W per GPU, cores, host GiB, weight)
NODE_TYPES = (
    (8, "NVIDIA H100 80GB HBM3", 80, 70.0, 700.0, 192, 2048, 0.55),
    (8, "NVIDIA A100-SXM4-80GB", 80, 50.0, 400.0, 128, 1024, 0.25),
    (8, "NVIDIA A100-SXM4-40GB", 40, 50.0, 400.0, 96, 1024, 0.10),
    (4, "NVIDIA L4", 24, 16.0, 72.0, 64, 512, 0.10),
)
# (gpus per node, GiB per GPU, cores, host GiB, disk GiB, gang nodes, sharing, weight)
TASK_SHAPES = (
    (0.25, 10, 2, 16, 20, 1, True, 0.15),
    (0.5, 20, 4, 32, 40, 1, True, 0.15),
    (1, 40, 8, 64, 100, 1, False, 0.20),
    (1, 75, 8, 96, 200, 1, False, 0.10),
    (2, 70, 16, 192, 300, 1, False, 0.10),
    (4, 60, 32, 384, 500, 1, False, 0.10),
    (8, 70, 64, 768, 1000, 1, False, 0.10),
    (8, 75, 96, 1024, 2000, 2, False, 0.05),
    (8, 75, 96, 1024, 2000, 4, False, 0.05),
)


def load_reference() -> ModuleType:
    """The literal reference transcription the tests check production against."""
    return importlib.import_module("tests.helpers.reference_algorithms")


def make_cluster(rng: random.Random, n_nodes: int, topology: str = "none", racks: int = 0) -> ClusterSnapshot:
    """A mixed cluster; about a third of the nodes already run whole-GPU work.

    :param topology: a simulated topology name given to every node ("none": no topology).
    :param racks: label the nodes ``rack=r<i % racks>`` (0: no labels).
    """
    shapes = {g: topology_from_facts(simulated_topology(topology, g, range(64))) for g in (4, 8)}
    nodes = []
    weights = [t[-1] for t in NODE_TYPES]
    for i in range(n_nodes):
        gpus, model, gib, idle, peak, cores, host_gib, _ = rng.choices(NODE_TYPES, weights)[0]
        busy = rng.choice((0, 0, 0, 0, 1, 2, 4)) if gpus == 8 else rng.choice((0, 0, 1))
        slots = tuple(
            GpuSlot(k, gib * GIB, 0 if k < busy else gib * GIB, 0.0 if k < busy else 1.0, k // 4)
            for k in range(gpus)
        )
        nodes.append(
            NodeSnapshot(
                node_id=f"node-{i:05d}",
                capacity=Resources(float(gpus), gpus * gib * GIB, float(cores), host_gib * GIB, 15_000 * GIB),
                used=Resources(float(busy), busy * gib * GIB, 8.0 * busy, 64 * busy * GIB, 200 * busy * GIB),
                gpus=slots,
                gpu_model=model,
                power=PowerCurve(idle_w=idle * gpus + 150.0, max_w=peak * gpus + 350.0),
                powered_on=rng.random() < 0.9,
                labels={"rack": f"r{i % racks}"} if racks else {},
                topology=shapes[gpus],
            )
        )
    return ClusterSnapshot(nodes=tuple(nodes))


def make_queue(rng: random.Random, n_requests: int) -> list[Request]:
    """Requests drawn from the task-shape catalogue, in queue order."""
    weights = [s[-1] for s in TASK_SHAPES]
    queue = []
    for k in range(n_requests):
        gpus, gib, cores, host_gib, disk_gib, gang, sharing, _ = rng.choices(TASK_SHAPES, weights)[0]
        whole = max(1, int(gpus))
        queue.append(
            Request(
                task_id=f"task-{k:05d}",
                demand=Resources(float(gpus), whole * gib * GIB, float(cores), host_gib * GIB, disk_gib * GIB),
                nodes=gang,
                gpu_mem_per_gpu_bytes=gib * GIB,
                allow_sharing=sharing,
                submit_s=float(k),
            )
        )
    return queue


def time_production(
    cluster: ClusterSnapshot, queue: list[Request], policy: str, seed: int, threshold: float, repeat: int,
    gang_label: str = "",
    mode: str | None = None,
) -> tuple[float, int, float, int, float]:
    """Seconds for the whole batch (best of ``repeat`` runs), plus the placed/refused counts and their seconds."""
    modes = {} if mode is None else {"mode": mode}
    engine = PlacementEngine.from_name(cluster, policy, threshold, seed=seed, gang_label=gang_label, **modes)
    order = sorted(queue, key=lambda r: -r.compute_demand) if engine.policy.sorts_requests else queue
    placed_s = refused_s = 0.0
    placed = refused = 0
    clock = time.process_time
    for req in order:
        start = clock()
        decision = engine.place(req)
        spent = clock() - start
        if isinstance(decision, Placement):
            placed, placed_s = placed + 1, placed_s + spent
        else:
            refused, refused_s = refused + 1, refused_s + spent
    best = float("inf")
    for _ in range(repeat):
        start = clock()
        PlacementEngine.from_name(cluster, policy, threshold, seed=seed, gang_label=gang_label,
                                  **modes).place_batch(queue)
        best = min(best, clock() - start)
    return best, placed, placed_s, refused, refused_s


def time_live(
    cluster: ClusterSnapshot, queue: list[Request], policy: str, seed: int, threshold: float, repeat: int,
    changed: int, gang_label: str = "", mode: str | None = None,
) -> tuple[float, int, int]:
    """Seconds for one leader cycle on a kept state (best of ``repeat``), the nodes it compared and applied.

    The first cycle builds the state (untimed, as a leader does once). A timed cycle is what the
    leader does per cycle: bring the kept state to the cycle's snapshot, then place the queue. That
    snapshot has new node objects (1) for every node the previous batch reserved on, holding what
    the state holds (as once the leader stored those placements: each is compared and found equal)
    and (2) for ``changed`` other nodes with a new power curve (a refit from telemetry: each is
    applied). So that every cycle places the same queue on the same cluster, the previous batch is
    undone before it, untimed (the leader never does that: its next snapshot has the placements).
    """
    modes = {} if mode is None else {"mode": mode}
    live = LivePlacement()
    live.engine(cluster, policy, threshold, seed=seed, gang_label=gang_label, **modes).place_batch(queue)
    rng = random.Random(seed)
    clock = time.process_time
    best, compared, applied = float("inf"), 0, 0
    for r in range(repeat):
        state = live.state
        assert state is not None
        reserved = [i for i in range(len(cluster.nodes)) if state.touched(i)]
        live.engine(cluster, policy, threshold, seed=seed, gang_label=gang_label, **modes)   # undo (untimed)
        state.used_array()   # and write the undone columns, which a leader would not have
        nodes = list(cluster.nodes)
        for i in reserved:
            nodes[i] = replace(nodes[i])
        for i in rng.sample(range(len(nodes)), min(changed, len(nodes))):
            node = nodes[i]
            nodes[i] = replace(node, power=PowerCurve(idle_w=node.power.idle_w + r + 1, max_w=node.power.max_w))
        snapshot = ClusterSnapshot(nodes=tuple(nodes))
        start = clock()
        live.engine(snapshot, policy, threshold, seed=seed, gang_label=gang_label, **modes).place_batch(queue)
        spent = clock() - start
        if spent < best:
            best, compared, applied = spent, live.compared, live.applied
    return best, compared, applied


def time_reference(
    reference: ModuleType, cluster: ClusterSnapshot, queue: list[Request], policy: str, threshold: float
) -> float:
    """Seconds the literal reference takes for ``queue``."""
    start = time.process_time()
    reference.reference_place(policy, cluster, queue, threshold, seed=1)
    return time.process_time() - start


def main() -> None:
    """Print one row per policy."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--reference-requests", type=int, default=100)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--threshold", type=float, default=0.9)
    parser.add_argument("--threshold-mode", choices=("whole-gpus", "paper"),
                        help="which dimensions the threshold caps (default: the engine's default)")
    parser.add_argument("--repeat", type=int, default=3, help="batch runs per policy; the fastest is reported")
    parser.add_argument("--topology", default="none", choices=("none", "hgx", "pcie-nvlink-pairs", "pcie"),
                        help="GPU topology of every node")
    parser.add_argument("--racks", type=int, default=0, help="rack labels (gangs placed by them); 0: none")
    parser.add_argument("--expected-runs", action="store_true",
                        help="give every request an expected run time (10 min to a day); without, time-aware "
                             "ranks like max-utilization")
    parser.add_argument("--run-times", type=int, default=len(EXPECTED_RUNS_S),
                        help="with --expected-runs: how many distinct run times (4: 10 min, 1 h, 4 h, a day; "
                             "N: N drawn from 10 min to a day, as N models' would be; 0: one drawn per request)")
    parser.add_argument("--changed", type=int, default=0,
                        help="nodes with a new power curve per cycle besides those the last batch reserved on "
                             "(default: 1%% of the nodes)")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    cluster = make_cluster(rng, args.nodes, args.topology, args.racks)
    queue = make_queue(rng, args.requests)
    if args.expected_runs:
        # The profiler's expected run times (what time-aware ranks by), from a separate stream so the
        # queue's shapes are those of a run without them.
        runs = random.Random(args.seed + 1)
        if args.run_times == len(EXPECTED_RUNS_S):
            choices: tuple[float, ...] = EXPECTED_RUNS_S
        else:
            choices = tuple(runs.uniform(EXPECTED_RUNS_S[0], EXPECTED_RUNS_S[-1]) for _ in range(args.run_times))
        queue = [replace(r, expected_run_s=runs.choice(choices) if choices else
                         runs.uniform(EXPECTED_RUNS_S[0], EXPECTED_RUNS_S[-1])) for r in queue]
    reference = load_reference()
    subset = queue[: args.reference_requests]
    mode = args.threshold_mode or "default"
    run_times = (f"expected run times ({args.run_times} distinct)" if args.run_times
                 else "expected run times (one drawn per request)")
    changed = args.changed or max(1, args.nodes // 100)
    print(f"{args.requests} queued requests on {args.nodes} nodes, threshold {args.threshold:g} ({mode} mode), "
          f"topology {args.topology}, racks {args.racks}, "
          f"{run_times if args.expected_runs else 'no expected run times'}")
    print(
        f"reference rates are extrapolated from its first {len(subset)} requests on the same cluster "
        "(it re-sorts every node for each request, so its rate barely depends on the queue length)"
    )
    print(f"decisions/s: one leader cycle on the kept state (LivePlacement), snapshot update included: the "
          f"nodes the previous batch reserved on are compared (equal), {changed} nodes with a new power curve "
          "applied, then the batch; rebuilt/s: the batch on an engine built from the snapshot (the state "
          "built every cycle, as before)")
    header = (f"{'policy':<16} {'decisions/s':>12} {'compared':>9} {'applied':>8} {'rebuilt/s':>10} {'placed':>7} "
              f"{'placed/s':>10} {'refused':>8} {'refused/s':>10}")
    print(header + f" {'reference/s':>12} {'speed-up':>9}")
    below = []
    for policy in POLICIES:
        total_s, placed, placed_s, refused, refused_s = time_production(
            cluster, queue, policy, args.seed, args.threshold, args.repeat, "rack" if args.racks else "",
            args.threshold_mode
        )
        live_s, compared, applied = time_live(cluster, queue, policy, args.seed, args.threshold, args.repeat,
                                              changed, "rack" if args.racks else "", args.threshold_mode)
        rate = len(queue) / live_s
        row = (f"{policy:<16} {rate:>12,.0f} {compared:>9} {applied:>8} {len(queue) / total_s:>10,.0f} {placed:>7} "
               f"{placed / max(placed_s, 1e-9):>10,.0f} {refused:>8} {refused / max(refused_s, 1e-9):>10,.0f}")
        try:
            ref_rate = len(subset) / time_reference(reference, cluster, subset, policy, args.threshold)
        except ValueError:   # a policy beyond the paper's (time-aware): no literal reference to compare with
            print(f"{row} {'—':>12} {'—':>9}")
        else:
            print(f"{row} {ref_rate:>12,.0f} {rate / ref_rate:>8,.0f}x")
        if rate < TARGET_RATE:
            below.append(policy)
    verdict = "met by every policy" if not below else f"missed by {', '.join(below)}"
    print(f"target ≥ {TARGET_RATE:,} decisions/s: {verdict}")


if __name__ == "__main__":
    main()
