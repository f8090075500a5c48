"""The elastic allocator: training jobs that grow into idle GPUs and give them back.

An elastic job runs at any size of its range (:class:`ElasticRange`): GPUs on one node up to a
node's width, whole nodes beyond it. It is resized by a checkpoint-restart, so every decision
weighs what a size is worth against what a restart costs, and a job resizes at most once per
``interval_s`` (hysteresis).

The rules, pure and shared by the leader (:mod:`coordinator.elastic.allocator`) and the simulator
(:mod:`coordinator.simulator.elastic`):

- **Sizing before commit** (:func:`first_size`, :func:`place_down`, :func:`size_placements`): a cycle
  places every pending elastic job along with the rest of the queue at its first size — the target
  of the resize that requeued it, else its minimum — and, refused there, at the largest smaller size
  that fits; when nothing was left waiting, the jobs just placed then take the idle GPUs left over,
  each up to its wish (its maximum for a new job, the allocator's target for a resized one), handed
  out by marginal speed-up per GPU. No restart is involved: nothing has started yet.
- **Shrink** (:func:`plan_shrinks`): a task left waiting takes GPUs from running elastic jobs of
  no higher priority, never below their minimum, from the node where that loses the least
  speed-up; the job restarts at the smaller size. A task waiting on its team queue's limit (not on a
  node) gets GPUs given back by its queue's elastic jobs wherever they run (:func:`plan_give_back`).
- **Grow** (:func:`plan_grows`): when no task is waiting, idle GPUs go to running elastic jobs by
  marginal speed-up per GPU, and a job grows only when the time it saves beats the restart:
  ``horizon × (1 − T(now)/T(new)) > restart cost``, the horizon being its remaining run time when known
  (the profiler's estimate; the trace's in the simulator), else an hour. A job within one node grows on
  its own node; when that node has no room for it, it moves: a grow is a restart anyway, so it takes a
  bigger size on another node its constraints allow (the one that fits it best). A grow only ever uses
  GPUs of nodes that are up: the caller passes idle GPUs of ready nodes only, so a grow never wakes a
  powered-off node.

Speed-up is learned per job (:class:`SpeedupCurve`): its measured throughput at each size it ran
(its own Prometheus counter, or GPU utilization × GPUs), interpolated in log-log between measured
sizes and extrapolated with the power law fitted to them (``T ∝ n^α``, ``α`` within [0, 1]; a job
measured at one size only assumes :data:`PRIOR_EXPONENT`).
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from coordinator.domain import NodeSnapshot, Placement, Rejection, Request

__all__ = ["DEFAULT_HORIZON_S", "DEFAULT_INTERVAL_S", "DEFAULT_RESTART_COST_S", "MAX_CURVE_POINTS", "NO_CURVE",
           "PRIOR_EXPONENT", "ElasticJob", "ElasticRange", "ElasticSettings", "Resize", "SpeedupCurve", "first_size",
           "idle_gpus", "node_accepts", "nodes_with_room", "place_down", "placement_gpus", "plan_give_back",
           "plan_grows", "plan_shrinks", "request_at", "size_placements"]

DEFAULT_INTERVAL_S = 60.0
"""A job resizes at most once per this many seconds: long enough that a restart (tens of seconds) is paid back
between two resizes, short enough that a job grows into GPUs that fell idle, or gives back what a waiting task
needs, within a minute."""
DEFAULT_RESTART_COST_S = 30.0
"""What a restart costs a job until its own restarts were measured."""
DEFAULT_HORIZON_S = 3600.0
"""How long a grown job is assumed to keep running at its new size, when its remaining run time is unknown."""
PRIOR_EXPONENT = 0.8
"""``T ∝ n^α`` assumed for a job measured at fewer than two sizes (about 1.74× per doubling)."""
MAX_CURVE_POINTS = 16
_EWMA = 0.3            # weight of a new throughput reading at a size already measured
_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class ElasticRange:
    """The sizes an elastic job may run at, in GPUs.

    Sizes up to ``node_gpus`` are GPUs on one node; beyond it, whole nodes of ``node_gpus`` each.

    :param min_gpus: the smallest size (≥ 1).
    :param max_gpus: the largest size.
    :param node_gpus: GPUs per node for sizes beyond one node (a multi-node job's GPUs per node).
    """

    min_gpus: int
    max_gpus: int
    node_gpus: int
    sizes: tuple[int, ...] = field(init=False, repr=False, compare=False)
    """Every size of the range, ascending."""

    def __post_init__(self) -> None:
        if self.min_gpus < 1 or self.max_gpus < self.min_gpus or self.node_gpus < 1:
            raise ValueError(f"elastic range {self.min_gpus}:{self.max_gpus} (node width {self.node_gpus}) is empty")
        small = list(range(self.min_gpus, min(self.max_gpus, self.node_gpus) + 1))
        big = [k * self.node_gpus for k in range(2, self.max_gpus // self.node_gpus + 1)
               if k * self.node_gpus >= self.min_gpus]
        object.__setattr__(self, "sizes", tuple(small + big))
        if not self.sizes:
            raise ValueError(f"elastic range {self.min_gpus}:{self.max_gpus} holds no size of whole nodes of "
                             f"{self.node_gpus} GPUs")

    @property
    def minimum(self) -> int:
        """The smallest size."""
        return self.sizes[0]

    @property
    def maximum(self) -> int:
        """The largest size."""
        return self.sizes[-1]

    def up(self, size: int) -> int | None:
        """The next size above ``size`` (None at the top)."""
        i = bisect.bisect_right(self.sizes, size)
        return self.sizes[i] if i < len(self.sizes) else None

    def down(self, size: int) -> int | None:
        """The next size below ``size`` (None at the bottom)."""
        i = bisect.bisect_left(self.sizes, size)
        return self.sizes[i - 1] if i > 0 else None

    def clamp(self, size: int) -> int:
        """The largest size of the range not above ``size`` (the minimum when ``size`` is below it)."""
        return next((s for s in reversed(self.sizes) if s <= size), self.minimum)

    def shape(self, size: int) -> tuple[int, int]:
        """``(nodes, GPUs per node)`` of a size."""
        if size <= self.node_gpus:
            return 1, size
        return size // self.node_gpus, self.node_gpus


def request_at(request: Request, rng: ElasticRange, size: int) -> Request:
    """The placement request of an elastic job at ``size`` GPUs (its other per-node demands unchanged)."""
    nodes, per_node = rng.shape(size)
    demand = replace(request.demand, gpus=float(per_node),
                     gpu_mem_total_bytes=request.gpu_mem_per_gpu_bytes * per_node)
    return replace(request, demand=demand, nodes=nodes)


def _fit_exponent(points: Sequence[tuple[int, float]]) -> float:
    """Least-squares ``α`` of ``log T = α log n + c`` over the points, within [0, 1] (the prior with fewer than two
    distinct sizes)."""
    if len(points) < 2:
        return PRIOR_EXPONENT
    xs = [math.log(n) for n, _ in points]
    ys = [math.log(t) for _, t in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    if var <= _EPS:
        return PRIOR_EXPONENT
    alpha = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var
    return min(1.0, max(0.0, alpha))


@dataclass(frozen=True, slots=True)
class SpeedupCurve:
    """A job's measured throughput by size, and what it predicts for sizes not measured.

    :param points: ``(GPUs, throughput)`` pairs, ascending by GPUs, throughput > 0 (any unit: samples,
        tokens, or busy GPUs).
    """

    points: tuple[tuple[int, float], ...] = ()
    exponent: float = field(init=False, repr=False, compare=False)
    """``α`` of the power law ``T ∝ n^α`` fitted to the measured sizes (least squares in log-log), within [0, 1];
    :data:`PRIOR_EXPONENT` with fewer than two sizes."""
    _one: float = field(init=False, repr=False, compare=False)
    _memo: dict[int, float] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_memo", {})
        object.__setattr__(self, "exponent", _fit_exponent(self.points))
        object.__setattr__(self, "_one", 0.0)
        object.__setattr__(self, "_one", self.throughput(1))

    def observe(self, gpus: int, throughput: float) -> SpeedupCurve:
        """The curve with a reading at ``gpus`` folded in (a moving average at a size already measured)."""
        return self.observe_all(gpus, (throughput,))

    def observe_all(self, gpus: int, readings: Iterable[float]) -> SpeedupCurve:
        """The curve with readings at ``gpus`` folded in one after the other, as :meth:`observe` folds each (the
        first at a size not measured yet stands for it, each later one moves the average); readings that are not
        finite and positive are skipped."""
        if gpus < 1:
            return self
        known = dict(self.points)
        value = known.get(gpus)
        for throughput in readings:
            if math.isfinite(throughput) and throughput > 0:
                value = throughput if value is None else (1 - _EWMA) * value + _EWMA * throughput
        if value is None or value == known.get(gpus):
            return self
        known[gpus] = value
        pts = sorted(known.items())
        if len(pts) > MAX_CURVE_POINTS:   # keep the extremes and the most recently measured size
            keep = {pts[0][0], pts[-1][0], gpus}
            rest = [p for p in pts if p[0] not in keep][: MAX_CURVE_POINTS - len(keep)]
            pts = [p for p in pts if p[0] in keep] + rest
            pts.sort()
        return SpeedupCurve(tuple(pts))

    def throughput(self, gpus: int) -> float:
        """Predicted throughput at ``gpus`` (relative units, ``gpus^α``, when nothing was measured)."""
        memo = self._memo
        value = memo.get(gpus)
        if value is None:
            value = memo[gpus] = self._predict(gpus)
        return value

    def _predict(self, gpus: int) -> float:
        pts = self.points
        if gpus < 1:
            return 0.0
        if not pts:
            return float(gpus) ** PRIOR_EXPONENT
        for n, t in pts:
            if n == gpus:
                return t
        alpha = self.exponent
        if gpus < pts[0][0]:
            return pts[0][1] * (gpus / pts[0][0]) ** alpha
        if gpus > pts[-1][0]:
            return pts[-1][1] * (gpus / pts[-1][0]) ** alpha
        for (n0, t0), (n1, t1) in itertools.pairwise(pts):
            if n0 < gpus < n1:   # log-log interpolation between the measured neighbours
                w = math.log(gpus / n0) / math.log(n1 / n0)
                return math.exp((1 - w) * math.log(t0) + w * math.log(t1))
        return float(gpus) ** alpha   # not reached

    def speedup(self, gpus: int) -> float:
        """Throughput at ``gpus`` over throughput at one GPU."""
        one = self._one
        return self.throughput(gpus) / one if one > 0 else 0.0

    def as_dict(self) -> dict[str, float]:
        """``{"GPUs": throughput}`` of the measured sizes (for the CLI's JSON)."""
        return {str(n): t for n, t in self.points}


NO_CURVE = SpeedupCurve()
"""The curve of a task that was never measured (one, shared: a curve is never changed in place)."""


@dataclass(frozen=True, slots=True)
class ElasticJob:
    """A running elastic job as the allocator sees it.

    :param task_id: its id.
    :param priority: its priority.
    :param range: the sizes it may run at.
    :param size: GPUs it holds now.
    :param nodes: the nodes it holds, in rank order, with its GPUs on each.
    :param curve: its learned throughput curve.
    :param restart_cost_s: what a restart costs it (measured, else the default).
    :param last_resize_s: when it was last resized (None: never), for the hysteresis.
    :param remaining_s: its expected remaining run time at its current size (None: unknown).
    :param protected_until_s: the end of its protected run time (``spec.min_runtime_s``): never shrunk before.
    """

    task_id: str
    priority: int
    range: ElasticRange
    size: int
    nodes: tuple[tuple[str, int], ...]
    curve: SpeedupCurve = field(default_factory=SpeedupCurve)
    restart_cost_s: float = DEFAULT_RESTART_COST_S
    last_resize_s: float | None = None
    remaining_s: float | None = None
    protected_until_s: float = 0.0

    def settled(self, now: float, interval_s: float) -> bool:
        """Whether its hysteresis allows a resize now."""
        return self.last_resize_s is None or now - self.last_resize_s >= interval_s

    def shrinkable(self, now: float, interval_s: float) -> bool:
        """Whether it may be shrunk now: settled, above its minimum, and past its protected run time."""
        return self.settled(now, interval_s) and self.size > self.range.minimum and now >= self.protected_until_s


@dataclass(frozen=True, slots=True)
class ElasticSettings:
    """How the allocator decides.

    :param interval_s: a job resizes at most once per this many seconds.
    :param restart_cost_s: the restart cost assumed for a job whose restarts were not measured yet.
    :param horizon_s: a grow must pay its restart back within this long (or the job's remaining run time
        when that is known and shorter).
    """

    interval_s: float = DEFAULT_INTERVAL_S
    restart_cost_s: float = DEFAULT_RESTART_COST_S
    horizon_s: float = DEFAULT_HORIZON_S

    def __post_init__(self) -> None:
        if self.interval_s < 0 or not math.isfinite(self.interval_s):
            raise ValueError(f"elastic interval must be ≥ 0 s, got {self.interval_s}")
        if self.restart_cost_s < 0 or not math.isfinite(self.restart_cost_s):
            raise ValueError(f"elastic restart cost must be ≥ 0 s, got {self.restart_cost_s}")
        if self.horizon_s <= 0 or not math.isfinite(self.horizon_s):
            raise ValueError(f"elastic horizon must be > 0 s, got {self.horizon_s}")


@dataclass(frozen=True, slots=True)
class Resize:
    """One resize decision.

    :param task_id: the job.
    :param from_gpus: its size now.
    :param to_gpus: its size after the restart.
    :param reason: why, in words.
    :param expected_speedup: predicted throughput after over before (below 1 for a shrink).
    :param for_task: the waiting task a shrink makes room for ("" for a grow).
    """

    task_id: str
    from_gpus: int
    to_gpus: int
    reason: str
    expected_speedup: float
    for_task: str = ""

    @property
    def grow(self) -> bool:
        """Whether it grows."""
        return self.to_gpus > self.from_gpus


def _marginal(curve: SpeedupCurve, size: int, to: int) -> float:
    """Speed-up (over one GPU) gained per GPU going from ``size`` to ``to``."""
    return (curve.speedup(to) - curve.speedup(size)) / max(1, to - size)


def _pays_back(curve: SpeedupCurve, size: int, to: int, restart_cost_s: float, horizon_s: float) -> bool:
    """Whether growing from ``size`` to ``to`` saves more than a restart costs within ``horizon_s``."""
    now, new = curve.throughput(size), curve.throughput(to)
    return new > now and horizon_s * (1.0 - now / new) > restart_cost_s


def _hand_out(jobs: Sequence[tuple[str, ElasticRange, SpeedupCurve, int, int]], idle_gpus: int,
              idle_nodes: Mapping[int, int]) -> dict[str, int]:
    """Idle GPUs to jobs by marginal speed-up per GPU: each step gives the best job its next size.

    :param jobs: ``(id, range, curve, size now, largest size wished)``.
    :param idle_gpus: GPUs free for sizes within one node.
    :param idle_nodes: node width → nodes with at least that many GPUs free (sizes beyond one node take whole
        nodes' worth of the job's width; a node taken counts against every width).
    :returns: id → new size, for the jobs that got more.
    """
    nodes_left = dict(idle_nodes)
    sizes = {j[0]: j[3] for j in jobs}
    by_id = {j[0]: j for j in jobs}
    heap: list[tuple[float, str]] = []

    def push(job_id: str) -> None:
        _id, rng, curve, _size, wish = by_id[job_id]
        nxt = rng.up(sizes[job_id])
        if nxt is not None and nxt <= wish:
            gain = _marginal(curve, sizes[job_id], nxt)
            if gain > _EPS:
                heapq.heappush(heap, (-gain, job_id))

    for j in jobs:
        push(j[0])
    while heap and (idle_gpus > 0 or any(nodes_left.values())):
        _gain, job_id = heapq.heappop(heap)
        rng = by_id[job_id][1]
        size = sizes[job_id]
        nxt = rng.up(size)
        assert nxt is not None
        if nxt <= rng.node_gpus:
            if idle_gpus < nxt - size:
                continue
            idle_gpus -= nxt - size
        else:   # whole nodes: going from one node to two takes a second node, and so on
            extra = nxt // rng.node_gpus - max(1, size // rng.node_gpus)
            if nodes_left.get(rng.node_gpus, 0) < extra:
                continue
            for w in nodes_left:
                nodes_left[w] = max(0, nodes_left[w] - extra)
        sizes[job_id] = nxt
        push(job_id)
    return {job_id: s for job_id, s in sizes.items() if s != by_id[job_id][3]}


def first_size(rng: ElasticRange, target: int) -> int:
    """The size a pending elastic job is placed at first: the target a resize gave it (a shrink planned room for
    exactly that), else its minimum."""
    return rng.clamp(target) if target else rng.minimum


def place_down(engine: _Placer, request: Request, rng: ElasticRange, refused: int) -> Placement | None:
    """A job refused at ``refused`` GPUs, placed at the largest smaller size of its range that fits (None: not
    even its minimum does)."""
    size = rng.down(refused)
    while size is not None:
        decision = engine.place(request_at(request, rng, size))
        if isinstance(decision, Placement):
            return decision
        size = rng.down(size)
    return None


def nodes_with_room(idle_by_node: Mapping[str, int], widths: Iterable[int]) -> dict[int, int]:
    """Width → nodes with at least that many idle GPUs (what a multi-node job of that width may grow into)."""
    return {w: sum(1 for idle in idle_by_node.values() if idle >= w) for w in set(widths)}


def size_placements(engine_place: _Placer, placed: Sequence[tuple[Request, ElasticRange, SpeedupCurve, Placement, int]],
                    idle_by_node: Mapping[str, int]) -> dict[str, Placement | None]:
    """Sizing before commit: elastic jobs placed in this cycle take idle GPUs up to their wish.

    :param engine_place: the cycle's engine (its reservations include the whole batch).
    :param placed: ``(request as placed, range, curve, its placement, wish)`` for each job placed.
    :param idle_by_node: node id → whole GPUs the engine has free on it after the batch (ready nodes only).
    :returns: task id → its new placement, for the jobs that got bigger (the others keep theirs); None for a
        job that no longer fits even at its old size once released (it waits for the next cycle).
    """
    plan = _hand_out([(r.task_id, rng, curve, rng.minimum if not p.assignments else placement_gpus(p), wish)
                      for r, rng, curve, p, wish in placed], sum(idle_by_node.values()),
                     nodes_with_room(idle_by_node, (rng.node_gpus for _r, rng, _c, _p, _w in placed)))
    out: dict[str, Placement | None] = {}
    for request, rng, _curve, placement, _wish in placed:
        target = plan.get(request.task_id)
        if target is None:
            continue
        engine_place.release(placement, request.gpu_mem_per_gpu_bytes)
        size: int | None = target
        while size is not None and size > placement_gpus(placement):
            decision = engine_place.place(request_at(request, rng, size))
            if isinstance(decision, Placement):
                out[request.task_id] = decision
                break
            size = rng.down(size)
        else:   # nothing bigger fits after all: back where it was (None in the rare case it no longer fits)
            again = engine_place.place(request_at(request, rng, placement_gpus(placement)))
            out[request.task_id] = again if isinstance(again, Placement) else None
    return out


class _Placer(Protocol):
    """What :func:`size_placements` needs of a placement engine."""

    def place(self, req: Request) -> Placement | Rejection: ...

    def release(self, placement: Placement, gpu_mem_per_gpu_bytes: int) -> None: ...


def idle_gpus(nodes: Iterable[NodeSnapshot]) -> dict[str, int]:
    """Node id → whole GPUs free on it, for the nodes that are schedulable and up (a grow never wakes a node)."""
    out: dict[str, int] = {}
    for node in nodes:
        if node.schedulable and node.powered_on and node.gpus:
            out[node.node_id] = sum(1 for g in node.gpus
                                    if g.share_free >= 1.0 - _EPS and g.mem_free_bytes >= g.mem_total_bytes)
    return out


def node_accepts(node: NodeSnapshot, request: Request) -> bool:
    """Whether the request's constraints (GPU model, node selector, nodes to avoid, nodes allowed) allow the node."""
    if request.gpu_model and request.gpu_model.lower() not in node.gpu_model.lower():
        return False
    if node.node_id in request.avoid_nodes or (request.only_nodes and node.node_id not in request.only_nodes):
        return False
    return all(node.labels.get(k) == v for k, v in request.node_selector.items())


def placement_gpus(placement: Placement) -> int:
    """Whole GPUs a placement holds over its nodes (an elastic job's size)."""
    return sum(len(a.gpu_indices) for a in placement.assignments)


def plan_grows(jobs: Iterable[ElasticJob], idle_by_node: Mapping[str, int], now: float,
               settings: ElasticSettings, accepts: Callable[[str, str], bool] = lambda task_id, node_id: True,
               ) -> list[Resize]:
    """Grow running elastic jobs into idle GPUs (call only when no task is waiting).

    A job within one node grows on its own node; one whose node has no room left for it moves: a grow is a
    restart anyway, so it takes a size that fits in another node's idle GPUs (:func:`_moves`). A multi-node
    job grows by whole idle nodes. Among the jobs the hysteresis allows, idle GPUs go by marginal speed-up
    per GPU, and a job grows only when the time it saves within the horizon (its remaining run time when
    known) pays for the restart.

    :param jobs: the running elastic jobs.
    :param idle_by_node: node id → whole GPUs idle on it (ready nodes only).
    :param now: the clock the jobs' ``last_resize_s`` uses.
    :param settings: the allocator's settings.
    :param accepts: whether a job's constraints allow a node, ``(task id, node id)`` (where it may move).
    """
    eligible = [j for j in jobs if j.settled(now, settings.interval_s) and j.size < j.range.maximum]
    if not eligible:
        return []
    idle = dict(idle_by_node)
    out: list[Resize] = []
    # Jobs within one node compete for their own node's idle GPUs; multi-node jobs for the whole idle nodes.
    by_node: dict[str, list[ElasticJob]] = {}
    wide: list[ElasticJob] = []
    for j in eligible:
        if j.size < j.range.node_gpus and len(j.nodes) == 1:
            by_node.setdefault(j.nodes[0][0], []).append(j)
        else:
            wide.append(j)
    granted: dict[str, int] = {}
    for node_id, group in sorted(by_node.items()):
        if idle.get(node_id, 0) <= 0:
            continue
        cap = {j.task_id: min(j.range.maximum, j.range.node_gpus) for j in group}
        granted.update(_hand_out([(j.task_id, j.range, j.curve, j.size, cap[j.task_id]) for j in group],
                                 idle[node_id], {}))
    grown: dict[str, int] = {}
    for j in eligible:
        if j.task_id in granted:
            to = _paying(j, granted[j.task_id], settings)
            if to is not None:
                grown[j.task_id] = to
                idle[j.nodes[0][0]] -= to - j.size
    stuck = [j for group in by_node.values() for j in group if j.task_id not in grown]
    moved = _moves(stuck, idle, settings, accepts) if stuck else {}
    grown.update(moved)
    if wide:
        held = {node for j in wide for node, _g in j.nodes}
        free = {n: v for n, v in idle.items() if n not in held}
        wide_granted = _hand_out([(j.task_id, j.range, j.curve, j.size, j.range.maximum) for j in wide], 0,
                                 nodes_with_room(free, (j.range.node_gpus for j in wide)))
        for j in wide:
            if j.task_id in wide_granted and (to := _paying(j, wide_granted[j.task_id], settings)) is not None:
                grown[j.task_id] = to
    for j in eligible:
        to = grown.get(j.task_id)
        if to is None:
            continue
        gain = j.curve.throughput(to) / j.curve.throughput(j.size)
        where = " on another node" if j.task_id in moved else ""
        out.append(Resize(j.task_id, j.size, to, f"idle GPUs{where}: expected speed-up ×{gain:.2f} for "
                          f"{to - j.size} more GPU(s)", gain))
    return out


def _paying(job: ElasticJob, to: int, settings: ElasticSettings) -> int | None:
    """The largest size up to ``to`` whose grow pays its restart back within the job's horizon (None: none does)."""
    horizon = settings.horizon_s if job.remaining_s is None else min(settings.horizon_s, job.remaining_s)
    size: int | None = to
    while size is not None and size > job.size and not _pays_back(job.curve, job.size, size, job.restart_cost_s,
                                                                   horizon):
        size = job.range.down(size)
    return size if size is not None and size > job.size else None


def _moves(jobs: Sequence[ElasticJob], idle: dict[str, int], settings: ElasticSettings,
           accepts: Callable[[str, str], bool]) -> dict[str, int]:
    """Jobs within one node that cannot grow on their own node, moved to another node where a bigger size fits.

    In order of marginal speed-up per GPU of their next size, each job takes the node (other than its own, and one
    its constraints allow) that fits it best: the fewest idle GPUs that hold its largest size within a node, else
    the most idle GPUs; it grows to the largest size there that pays its restart back. ``idle`` is booked as it
    goes (the GPUs a job leaves are not: they are free only once it restarted).

    :returns: job id → new size.
    """
    by_count: dict[int, dict[str, None]] = {}   # idle GPUs → nodes with that many (insertion-ordered sets)
    for node_id, v in sorted(idle.items()):
        if v > 0:
            by_count.setdefault(v, {})[node_id] = None
    if not by_count:
        return {}
    order = []
    for j in jobs:
        nxt = j.range.up(j.size)
        if nxt is not None:
            order.append((-_marginal(j.curve, j.size, nxt), j.task_id, j))
    order.sort(key=lambda o: (o[0], o[1]))
    out: dict[str, int] = {}
    for _gain, _id, j in order:
        cap = min(j.range.maximum, j.range.node_gpus)
        own = j.nodes[0][0]
        bigger = j.range.up(j.size)
        assert bigger is not None
        counts = sorted(c for c in by_count if c >= bigger)
        best = [c for c in counts if c >= cap] + [c for c in reversed(counts) if c < cap]
        for count in best:
            target = next((n for n in by_count[count] if n != own and accepts(j.task_id, n)), None)
            if target is None:
                continue
            to = _paying(j, j.range.clamp(min(cap, count)), settings)
            if to is None:
                break   # a smaller node would pay back even less
            out[j.task_id] = to
            del by_count[count][target]
            if not by_count[count]:
                del by_count[count]
            left = count - to
            idle[target] = left
            if left > 0:
                by_count.setdefault(left, {})[target] = None
            break
    return out


def plan_shrinks(waiting: Sequence[Request], jobs: Iterable[ElasticJob], idle_by_node: Mapping[str, int], now: float,
                 settings: ElasticSettings, accepts: Callable[[Request, str], bool] = lambda req, node_id: True,
                 ) -> list[Resize]:
    """Shrink running elastic jobs (never below their minimum, never inside their protected run time) so that
    waiting tasks can be placed.

    For each waiting request in the given order (the queue's), the node (or nodes, for a gang) where its
    GPUs can be found losing the least speed-up: idle GPUs first, then elastic jobs of no higher priority
    than the request that the hysteresis allows to resize, the job losing the least per GPU first. Of the
    nodes that could, the :data:`_OPTIONS` needing the fewest GPUs taken are weighed. A job is shrunk once
    per call, to the smallest size any request needed of it.

    :param waiting: requests left waiting (whole GPUs only; shared fractions are skipped), in queue order.
    :param jobs: the running elastic jobs.
    :param idle_by_node: node id → whole GPUs idle on it (schedulable nodes).
    :param now: the clock the jobs' ``last_resize_s`` uses.
    :param settings: the allocator's settings.
    :param accepts: whether a request's constraints allow a node (:func:`node_accepts`).
    """
    jobs = [j for j in jobs if j.shrinkable(now, settings.interval_s)]
    if not jobs:
        return []
    index = _ShrinkIndex(jobs, idle_by_node)
    chosen: dict[str, tuple[int, str]] = {}   # job → (new size, for task)
    for req in waiting:
        need = req.whole_gpus
        if need <= 0:
            continue
        free = index.constrained_fit if req.constraint_key is not None else None
        if req.nodes == 1 and (index.fits_idle(need) if free is None else free(req, need, accepts)):
            continue   # its GPUs are free already: it waits for something else (CPU, memory), not for these
        options = index.options(req, need, accepts)
        if len(options) < req.nodes:
            continue
        options.sort(key=lambda o: (o[0], o[1]))
        for _loss, node_id, new_sizes in options[: req.nodes]:
            index.take(node_id, need, new_sizes)
            for job_id, new in new_sizes.items():
                chosen[job_id] = (new, req.task_id)
    out: list[Resize] = []
    by_id = {j.task_id: j for j in jobs}
    for job_id, (new, for_task) in sorted(chosen.items()):
        j = by_id[job_id]
        ratio = j.curve.throughput(new) / j.curve.throughput(j.size)
        out.append(Resize(job_id, j.size, new, f"{for_task} is waiting for GPUs: shrinks to {new} "
                          f"(expected throughput ×{ratio:.2f})", ratio, for_task))
    return out


def plan_give_back(for_task: str, priority: int, gpus: int, jobs: Iterable[ElasticJob], now: float,
                   settings: ElasticSettings, why: str) -> list[Resize]:
    """Shrink running elastic jobs (never below their minimum, never inside their protected run time) so that
    together they give back ``gpus`` GPUs, wherever those are: a task of their team queue waits on the queue's limit
    (or its borrowing), not on a node. Jobs of no higher priority than ``priority`` that the hysteresis allows are
    shrunk, the one losing the least speed-up per GPU first; nothing when they cannot give back that many.

    :param for_task: the waiting task.
    :param gpus: GPUs to give back.
    :param jobs: the candidates (the waiting task's queue's running elastic jobs, in its GPU pool).
    :param why: what the task waits on, in words (the resize's reason).
    """
    group = [j for j in jobs if j.shrinkable(now, settings.interval_s) and j.priority <= priority]
    plan = _free_on(None, gpus, group, {j.task_id: j.size for j in group}, {j.task_id: dict(j.nodes) for j in group})
    if plan is None or gpus <= 0:
        return []
    by_id = {j.task_id: j for j in group}
    out = []
    for job_id, new in sorted(plan[1].items()):
        j = by_id[job_id]
        ratio = j.curve.throughput(new) / j.curve.throughput(j.size)
        out.append(Resize(job_id, j.size, new, f"{for_task} is waiting on {why}: shrinks to {new} "
                          f"(expected throughput ×{ratio:.2f})", ratio, for_task))
    return out


_OPTIONS = 16
"""Nodes weighed per waiting request (those needing the fewest GPUs taken first); the least loss among them wins."""


class _ShrinkIndex:
    """What :func:`plan_shrinks` books as it goes: idle GPUs by node and by count, each job's size and GPUs by
    node, and an upper bound of what shrinking could free on each node, so a request looks at few nodes."""

    def __init__(self, jobs: Sequence[ElasticJob], idle_by_node: Mapping[str, int]) -> None:
        self.idle = dict(idle_by_node)
        self.size = {j.task_id: j.size for j in jobs}
        self.gpus_on: dict[str, dict[str, int]] = {j.task_id: dict(j.nodes) for j in jobs}
        self.on_node: dict[str, list[ElasticJob]] = {}
        self.room: dict[str, int] = {}    # node → at most what shrinking its jobs could free there
        for j in jobs:
            for node_id, g in j.nodes:
                self.on_node.setdefault(node_id, []).append(j)
                self.room[node_id] = self.room.get(node_id, 0) + min(g, j.size - j.range.minimum)
        self.idle_count: dict[int, int] = {}       # idle GPUs → nodes with that many
        for v in self.idle.values():
            self.idle_count[v] = self.idle_count.get(v, 0) + 1
        # idle + room → nodes with elastic jobs and that much potential (an insertion-ordered set)
        self.by_potential: dict[int, dict[str, None]] = {}
        for node_id in self.on_node:
            self.by_potential.setdefault(self._potential(node_id), {})[node_id] = None

    def _potential(self, node_id: str) -> int:
        return self.idle.get(node_id, 0) + self.room.get(node_id, 0)

    def fits_idle(self, need: int) -> bool:
        """Whether some node has ``need`` idle GPUs."""
        return any(v >= need and n > 0 for v, n in self.idle_count.items())

    def constrained_fit(self, req: Request, need: int, accepts: Callable[[Request, str], bool]) -> bool:
        """Whether some node the request accepts has ``need`` idle GPUs."""
        return any(v >= need and accepts(req, n) for n, v in self.idle.items())

    def options(self, req: Request, need: int,
                accepts: Callable[[Request, str], bool]) -> list[tuple[float, str, dict[str, int]]]:
        """Up to :data:`_OPTIONS` (more for a gang) nodes where the request's GPUs can be found, with the speed-up
        lost and the shrinks: nodes with the most to give first."""
        want = max(_OPTIONS, 2 * req.nodes)
        out: list[tuple[float, str, dict[str, int]]] = []
        for potential in sorted((p for p in self.by_potential if p >= need), reverse=True):
            for node_id in self.by_potential[potential]:
                short = need - self.idle.get(node_id, 0)
                if not accepts(req, node_id):
                    continue
                group = [j for j in self.on_node[node_id] if j.priority <= req.priority]
                plan = _free_on(node_id, short, group, self.size, self.gpus_on)
                if plan is not None:
                    out.append((plan[0], node_id, plan[1]))
                    if len(out) >= want:
                        return out
        return out

    def take(self, node_id: str, need: int, new_sizes: Mapping[str, int]) -> None:
        """Book a request placed on a node with these shrinks."""
        freed = 0
        for job_id, new in new_sizes.items():
            step = self.size[job_id] - new
            freed += step
            self.size[job_id] = new
            _take_from(self.gpus_on[job_id], node_id, step)
        if node_id in self.on_node:
            self.by_potential.get(self._potential(node_id), {}).pop(node_id, None)
        self.room[node_id] = max(0, self.room.get(node_id, 0) - freed)
        old = self.idle.get(node_id, 0)
        new_idle = max(0, old + freed - need)
        self.idle[node_id] = new_idle
        self.idle_count[old] = self.idle_count.get(old, 1) - 1
        self.idle_count[new_idle] = self.idle_count.get(new_idle, 0) + 1
        if node_id in self.on_node:
            self.by_potential.setdefault(self._potential(node_id), {})[node_id] = None


def _take_from(gpus: dict[str, int], node_id: str, freed: int) -> None:
    """Book ``freed`` GPUs of a job as given back on ``node_id`` (whole nodes drop out when emptied)."""
    left = gpus.get(node_id, 0) - freed
    if left > 0:
        gpus[node_id] = left
    else:
        gpus.pop(node_id, None)


def _free_on(node_id: str | None, short: int, group: Sequence[ElasticJob], size: Mapping[str, int],
             gpus_on: Mapping[str, Mapping[str, int]]) -> tuple[float, dict[str, int]] | None:
    """Shrinks of the jobs on one node (``None``: wherever their GPUs are) that free ``short`` GPUs there, losing
    the least speed-up per GPU; ``(speed-up lost, job → new size)``, None when they cannot. ``short ≤ 0`` needs
    none."""
    if short <= 0:
        return 0.0, {}
    new: dict[str, int] = {}
    here = {j.task_id: size[j.task_id] if node_id is None else gpus_on[j.task_id].get(node_id, 0) for j in group}
    loss = 0.0
    freed = 0
    heap: list[tuple[float, str]] = []
    by_id = {j.task_id: j for j in group}

    def push(j: ElasticJob) -> None:
        cur = new.get(j.task_id, size[j.task_id])
        down = j.range.down(cur)
        # A step must come off this node: within one node any GPU does; a multi-node job gives back a whole node.
        if down is None or here[j.task_id] < cur - down:
            return
        heapq.heappush(heap, (_marginal(j.curve, down, cur), j.task_id))

    for j in group:
        push(j)
    while heap and freed < short:
        per_gpu, job_id = heapq.heappop(heap)
        j = by_id[job_id]
        cur = new.get(job_id, size[job_id])
        down = j.range.down(cur)
        assert down is not None
        new[job_id] = down
        here[job_id] -= cur - down
        freed += cur - down
        loss += per_gpu * (cur - down)
        push(j)
    if freed < short:
        return None
    return loss, new
