"""Small builders for scheduling inputs (nodes, requests, random clusters) used by the coordinator tests."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping

from common.pb.gptrm.v1 import agent_pb2, types_pb2
from coordinator.domain import ClusterSnapshot, GpuSlot, NodeSnapshot, PowerCurve, Request, Resources
from coordinator.monitor.nodes import NodeRegistry

__all__ = [
    "GIB",
    "make_node",
    "make_request",
    "place_one",
    "random_cluster",
    "random_requests",
    "sequence",
    "start_decision",
    "table_cluster",
]

GIB = 1024**3


def make_node(
    node_id: str,
    *,
    gpus: int = 8,
    used_gpus: int = 0,
    gpu_mem_gib: int = 80,
    cpu: float = 64.0,
    used_cpu: float = 0.0,
    mem_gib: int = 512,
    used_mem_gib: int = 0,
    disk_gib: int = 2000,
    idle_w: float = 560.0,
    max_w: float = 5600.0,
    powered_on: bool = True,
    topology: tuple[int, ...] | None = None,
    gpu_model: str = "NVIDIA H100 80GB HBM3",
    labels: Mapping[str, str] | None = None,
    schedulable: bool = True,
) -> NodeSnapshot:
    """A consistent node: its first ``used_gpus`` GPUs are reserved whole (memory and share)."""
    per_gpu = gpu_mem_gib * GIB
    slots = tuple(
        GpuSlot(
            index=k,
            mem_total_bytes=per_gpu,
            mem_free_bytes=0 if k < used_gpus else per_gpu,
            share_free=0.0 if k < used_gpus else 1.0,
            topology_group=topology[k] if topology else -1,
        )
        for k in range(gpus)
    )
    return NodeSnapshot(
        node_id=node_id,
        capacity=Resources(gpus, gpus * per_gpu, cpu, mem_gib * GIB, disk_gib * GIB),
        used=Resources(float(used_gpus), used_gpus * per_gpu, used_cpu, used_mem_gib * GIB, 0),
        gpus=slots,
        gpu_model=gpu_model if gpus else "",
        labels=dict(labels or {}),
        schedulable=schedulable,
        powered_on=powered_on,
        power=PowerCurve(idle_w=idle_w, max_w=max_w),
    )


def make_request(
    task_id: str,
    *,
    gpus: float = 1.0,
    per_gpu_gib: float = 0.0,
    cpu: float = 4.0,
    mem_gib: int = 32,
    disk_gib: int = 0,
    nodes: int = 1,
    allow_sharing: bool = False,
    gpu_model: str = "",
    node_selector: Mapping[str, str] | None = None,
    priority: int = 0,
) -> Request:
    """A request whose node-total GPU memory is ``max(1, ceil(gpus)) × per_gpu_gib``."""
    per_gpu = int(per_gpu_gib * GIB)
    count = max(1, math.ceil(gpus)) if gpus > 0 else 0
    return Request(
        task_id=task_id,
        demand=Resources(gpus, count * per_gpu, cpu, mem_gib * GIB, disk_gib * GIB),
        nodes=nodes,
        gpu_mem_per_gpu_bytes=per_gpu,
        priority=priority,
        gpu_model=gpu_model,
        node_selector=dict(node_selector or {}),
        allow_sharing=allow_sharing,
    )


def random_cluster(rng: random.Random, n_nodes: int) -> ClusterSnapshot:
    """A random cluster the reference understands: whole-GPU reservations, schedulable nodes.

    Few distinct GPU counts, utilizations and power curves, so ties are common and the
    tie-break is exercised.
    """
    nodes = []
    for i in range(n_nodes):
        gpus = rng.choice((0, 1, 2, 4, 4, 8, 8, 8))
        cpu = rng.choice((16, 32, 64))
        idle, peak = rng.choice(((70.0, 700.0), (50.0, 400.0), (16.0, 72.0)))
        nodes.append(
            make_node(
                f"n{i:03d}",
                gpus=gpus,
                used_gpus=rng.randint(0, gpus) if rng.random() < 0.6 else 0,
                gpu_mem_gib=rng.choice((24, 40, 80)),
                cpu=float(cpu),
                used_cpu=rng.randint(0, cpu) / 2 if rng.random() < 0.5 else 0.0,
                mem_gib=rng.choice((128, 256, 512)),
                used_mem_gib=rng.randint(0, 63) if rng.random() < 0.5 else 0,
                disk_gib=rng.choice((500, 2000)),
                idle_w=idle * max(gpus, 1),
                max_w=peak * max(gpus, 1),
                powered_on=rng.random() < 0.85,
            )
        )
    return ClusterSnapshot(nodes=tuple(nodes))


def random_requests(rng: random.Random, n: int, *, gang: bool = True) -> list[Request]:
    """Random whole-GPU requests (some CPU-only, some gangs), without per-GPU memory checks."""
    requests = []
    for k in range(n):
        gpus = float(rng.choice((0, 1, 1, 2, 2, 3, 4, 8)))
        requests.append(
            Request(
                task_id=f"t{k:03d}",
                demand=Resources(
                    gpus=gpus,
                    gpu_mem_total_bytes=int(gpus * rng.choice((10, 24, 40, 80)) * GIB),
                    cpu_cores=rng.randint(1, 16) / 2,
                    mem_bytes=rng.randint(1, 128) * GIB,
                    disk_bytes=rng.randint(0, 399) * GIB,
                ),
                nodes=rng.choice((1, 1, 1, 1, 2, 3)) if gang else 1,
            )
        )
    return requests


def table_cluster() -> ClusterSnapshot:
    """The small fixed cluster of the policy tables (threshold 0.9 in paper mode everywhere).

    ======  =====  ====  ======  ================  =====================
    node    GPUs   used  util    curve (idle/max)  slope = max - idle
    ======  =====  ====  ======  ================  =====================
    n1      8      6     0.75    H100 560/5600     5040
    n2      8      2     0.25    H100 560/5600     5040
    n3      4      0     0.00    L4   64/288       224 (nothing allocated: asleep)
    n4      8      4     0.50    A100 400/3200     2800
    ======  =====  ====  ======  ================  =====================

    GPU limits at threshold 0.9: 7.2 on the 8-GPU nodes, 3.6 on n3.
    """
    return ClusterSnapshot(
        nodes=(
            make_node("n1", gpus=8, used_gpus=6, idle_w=560.0, max_w=5600.0),
            make_node("n2", gpus=8, used_gpus=2, idle_w=560.0, max_w=5600.0),
            make_node("n3", gpus=4, used_gpus=0, gpu_mem_gib=24, idle_w=64.0, max_w=288.0, gpu_model="NVIDIA L4"),
            make_node("n4", gpus=8, used_gpus=4, idle_w=400.0, max_w=3200.0, gpu_model="NVIDIA A100-SXM4-80GB"),
        )
    )


def place_one(policy: str, gpus: float, *, seed: int = 0, cluster: ClusterSnapshot | None = None) -> str | None:
    """Where a single request of ``gpus`` GPUs lands on the table cluster (None: refused)."""
    from coordinator.domain import Placement
    from coordinator.scheduler.placement.engine import PlacementEngine

    engine = PlacementEngine.from_name(cluster or table_cluster(), policy, 0.9, seed=seed, mode="paper")
    decision = engine.place(make_request("t", gpus=gpus, cpu=1.0, mem_gib=1))
    return decision.node_ids[0] if isinstance(decision, Placement) else None


def sequence(policy: str, gpus: list[float], *, seed: int = 0, cluster: ClusterSnapshot | None = None) -> list:
    """Where each of several requests lands, decided one after the other in the given order."""
    from coordinator.domain import Placement
    from coordinator.scheduler.placement.engine import PlacementEngine

    engine = PlacementEngine.from_name(cluster or table_cluster(), policy, 0.9, seed=seed, mode="paper")
    out = []
    for k, g in enumerate(gpus):
        decision = engine.place(make_request(f"t{k}", gpus=g, cpu=1.0, mem_gib=1))
        out.append(decision.node_ids[0] if isinstance(decision, Placement) else None)
    return out


def start_decision(task_id: str, argv: list[str], gpus: list[int] | tuple[int, ...] = (),
                   env: Mapping[str, str] | None = None) -> agent_pb2.Decision:
    """A StartTask decision for an agent (GPU uuids ``GPU-<index>``, 2 s stop grace)."""
    d = agent_pb2.Decision(decision_id=f"d-{task_id}")
    d.start.task_id = task_id
    d.start.argv.extend(argv)
    d.start.env.update(env or {})
    d.start.gpu_indices.extend(gpus)
    d.start.gpu_uuids.extend(f"GPU-{i}" for i in gpus)
    d.start.stop_grace_s = 2.0
    return d


def connected_registry(*node_ids: str, gpus: int = 4) -> NodeRegistry:
    """A node table with ``node_ids`` connected: ``gpus`` H100s of 80 GiB, 16 cores and 64 GiB each (no stream)."""
    registry = NodeRegistry(1.0, 30.0)
    for node_id in node_ids:
        inv = types_pb2.NodeInventory(node_id=node_id, cpu_cores=16, mem_total_bytes=64 * 1024**3)
        for i in range(gpus):
            inv.gpus.add(index=i, model="H100", mem_total_bytes=80 * 1024**3)
        registry.connect(inv, outbox=None)  # type: ignore[arg-type]
    return registry
