"""The elastic allocator's decision rate: 10,000 running elastic jobs on 5,000 nodes of 8 GPUs.

Run with ``.venv/bin/python tests/bench/bench_elastic.py [--nodes N] [--jobs N] [--waiting N] [--seed S]``.

Every node runs two elastic jobs (1:8 GPUs on one node, sizes drawn so that about a fifth of the GPUs are idle), each
with a learned curve of its own (measured at two or three sizes, exponents 0.3-1.0), and a tenth of them inside
their hysteresis. Three passes of the production rules (:mod:`coordinator.elastic.rules`) are timed, each the fastest of
``--repeat`` runs, in CPU seconds of this process:

- **grow**: nothing waits, the idle GPUs go to the jobs by marginal speed-up (:func:`plan_grows`);
- **shrink**: ``--waiting`` rigid tasks of 1-8 GPUs wait on the same cluster with no GPU idle, the jobs give GPUs
  back for them (:func:`plan_shrinks`);
- **sizing**: ``--waiting`` new elastic jobs placed at their minimum take what is left over, through the
  placement engine (:func:`size_placements`).

The baseline in the same run is what a static scheduler does with the same queue: the placement engine deciding the
``--waiting`` rigid tasks on the same cluster (``place_batch``, engine built from the snapshot included). A
scheduling cycle runs once a second; the allocator's pass at this scale must fit well inside it (target: 100 ms).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from coordinator.domain import ClusterSnapshot, GpuSlot, Placement, Request, Resources  # noqa: E402
from coordinator.elastic.rules import (  # noqa: E402
    ElasticJob,
    ElasticRange,
    ElasticSettings,
    SpeedupCurve,
    idle_gpus,
    plan_grows,
    plan_shrinks,
    request_at,
    size_placements,
)
from coordinator.scheduler.placement.engine import PlacementEngine  # noqa: E402
from tests.helpers.builders import GIB, make_node  # noqa: E402

TARGET_PASS_S = 0.1
NOW = 1_000_000.0


def _cluster(nodes: int, jobs: int, rng: random.Random) -> tuple[ClusterSnapshot, list[ElasticJob]]:
    snaps = []
    elastic: list[ElasticJob] = []
    per_node = max(1, jobs // nodes)
    for i in range(nodes):
        node_id = f"n{i:05d}"
        sizes = []
        left = 8
        for _ in range(per_node):
            if left <= 0:
                break
            size = rng.randint(1, max(1, min(left, 8 // per_node + 1)))
            sizes.append(size)
            left -= size
        used = sum(sizes)
        base = make_node(node_id, gpus=8, gpu_mem_gib=80, disk_gib=1000, gpu_model="NVIDIA H100 80GB HBM3")
        gpus = tuple(GpuSlot(g.index, g.mem_total_bytes, 0 if g.index < used else g.mem_total_bytes,
                             0.0 if g.index < used else 1.0, g.topology_group) for g in base.gpus)
        snaps.append(base.__class__(**{**{f: getattr(base, f) for f in base.__dataclass_fields__},
                                       "gpus": gpus, "used": Resources(gpus=float(used),
                                                                       gpu_mem_total_bytes=used * 80 * GIB)}))
        for k, size in enumerate(sizes):
            alpha = rng.uniform(0.3, 1.0)
            curve = SpeedupCurve()
            for n in rng.sample([1, 2, 4, 8], rng.randint(2, 3)):
                curve = curve.observe(n, 100.0 * n ** alpha)
            last = NOW - rng.uniform(0, 100) if rng.random() < 0.1 else NOW - 10_000
            elastic.append(ElasticJob(f"e{i}-{k}", rng.randint(0, 2), ElasticRange(1, 8, 8), size,
                                      ((node_id, size),), curve, last_resize_s=last))
    return ClusterSnapshot(nodes=tuple(snaps)), elastic


def _waiting(n: int, rng: random.Random, prefix: str = "w") -> list[Request]:
    return [Request(f"{prefix}{k}", Resources(gpus=float(g := rng.choice((1, 2, 4, 8))), gpu_mem_total_bytes=g * GIB),
                    gpu_mem_per_gpu_bytes=GIB, priority=rng.randint(0, 2)) for k in range(n)]


def _best(fn, repeat: int) -> tuple[float, object]:   # type: ignore[no-untyped-def]
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.process_time()
        out = fn()
        best = min(best, time.process_time() - t0)
    return best, out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=5000)
    p.add_argument("--jobs", type=int, default=10_000)
    p.add_argument("--waiting", type=int, default=1000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--seed", type=int, default=7)
    args = p.parse_args()
    rng = random.Random(args.seed)
    snapshot, jobs = _cluster(args.nodes, args.jobs, rng)
    waiting = _waiting(args.waiting, rng)
    settings = ElasticSettings()
    idle = idle_gpus(snapshot.nodes)
    print(f"{len(snapshot.nodes)} nodes × 8 GPUs, {len(jobs)} running elastic jobs, {sum(idle.values())} idle GPUs, "
          f"{len(waiting)} waiting tasks")

    grow_s, grows = _best(lambda: plan_grows(jobs, idle, NOW, settings), args.repeat)
    # Shrinking is for a full cluster: the same jobs with no GPU idle anywhere.
    full = dict.fromkeys(idle, 0)
    shrink_s, shrinks = _best(lambda: plan_shrinks(waiting, jobs, full, NOW, settings), args.repeat)

    def sizing() -> int:
        engine = PlacementEngine.from_name(snapshot, "max-utilization")
        rng_e = ElasticRange(1, 8, 8)
        placed = []
        for r in _waiting(args.waiting, random.Random(args.seed + 1), prefix="new"):
            r = request_at(r, rng_e, 1)
            d = engine.place(r)
            if isinstance(d, Placement):
                placed.append((r, rng_e, SpeedupCurve(), d, 8))
        return len(size_placements(engine, placed, idle_gpus(engine.snapshot().nodes)))

    sizing_s, sized = _best(sizing, args.repeat)

    def static() -> int:
        engine = PlacementEngine.from_name(snapshot, "max-utilization")
        return sum(isinstance(d, Placement) for d in engine.place_batch(waiting))

    static_s, placed = _best(static, args.repeat)
    assert isinstance(grows, list) and isinstance(shrinks, list)
    print(f"{'pass':<34} {'seconds':>9} {'decided/s':>11} {'resizes':>8}")
    rows = [("grow (10,000 jobs considered)", grow_s, len(jobs), len(grows)),
            (f"shrink ({len(waiting)} waiting tasks)", shrink_s, len(waiting), len(shrinks)),
            (f"sizing ({len(waiting)} new elastic jobs)", sizing_s, len(waiting), sized),
            (f"baseline: place_batch ({len(waiting)})", static_s, len(waiting), placed)]
    for name, secs, decided, n in rows:
        print(f"{name:<34} {secs:>9.4f} {decided / max(secs, 1e-9):>11,.0f} {n:>8}")
    worst = max(grow_s, shrink_s)
    verdict = "PASS" if worst <= TARGET_PASS_S else "MISS"
    print(f"allocator pass (grow or shrink) at most {worst * 1000:.1f} ms per cycle: target ≤ "
          f"{TARGET_PASS_S * 1000:.0f} ms — {verdict}")


if __name__ == "__main__":
    main()
