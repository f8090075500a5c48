"""Measured training-throughput curves for elastic replays, and which curve a trace job gets.

The measurements ship with the package (``coordinator/simulator/data/scaling/pollux/<model>/``, source,
licence and schema in that directory's README): ``placements.csv`` (placements on nodes of 4 GPUs, one digit
per node) and ``scalability.csv`` (larger scales by ``num_nodes,num_replicas``). The throughput of a
measurement at per-GPU batch ``b`` is ``replicas × b / step_time`` samples per second.

One **true** curve per model, throughput by GPU count for 1..:data:`MAX_GPUS` (:func:`load_curves`):

- **batch size**: one fixed per-GPU batch ``b`` per model, the largest measured on one GPU that is also
  measured at every placement and every scale of both files, so every point is a measurement at the
  same ``b`` (the models' largest batches are not measured at the largest scales: memory and the
  global batch limit). Should a placement or scale lack ``b``, its throughput per replica measured at the
  batch nearest to ``b`` (in log) stands in for it; with the data as shipped this never happens.
- **GPU count**: a placement's count is the sum of its digits, a scale's its ``num_replicas``. A count
  measured several ways (``4`` on one node, ``22``, ``1111``, or 16 replicas on 8, 12 or 16 nodes)
  takes its best measurement: the placement a scheduler would choose. Counts not measured are
  interpolated in log-log between the nearest measured counts; above the largest measured count the
  last two measured counts' power law extends it.
- **monotone**: a count never has less throughput than a smaller count (a running maximum): a job
  given more GPUs can leave the extra ones idle, so measured slow-downs at large scales (fixed
  per-GPU batch, synchronisation-bound) are flattened to the best smaller count.

**Measurement spread** (:attr:`ScalingCurve.noise`, the elastic replay's default throughput noise): the files
hold one measurement per placement and batch, so the spread is read off the measurements' own scatter. Within
one placement (or scale), step time is a smooth function of the per-GPU batch; each measurement between two
neighbouring batches is compared with the log-log interpolation of those two, and the residual ``r`` of
``log step_time`` is divided by ``sqrt(1 + w² + (1 − w)²)`` (``w`` the interpolation weight), which is what
three measurements with independent relative errors of standard deviation ``σ`` give it. ``noise`` is the
root mean square of those over the model's files: the relative standard deviation of one throughput
reading (about 3–9 % on the shipped curves, curvature of the batch trend included, so it errs high).

The curve is indexed by GPU count only; the replayed cluster's own node width is not modelled
(measured on 4-GPU nodes, a count placed on 8-GPU nodes gets the same throughput).

Model per trace job (:func:`assign_models`) follows the GPU-time classes of the measurement's own
workload generator (the README's table): a job's GPU-hours (trace duration × GPUs) < 1 → ``cifar10``
or ``ncf``, 1–10 → ``deepspeech2`` or ``bert``, 10–100 → ``yolov3``, ≥ 100 → ``imagenet``; within a
pair the choice is a seeded random draw, one per job in trace order.
"""

from __future__ import annotations

import csv
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MAX_GPUS", "MODELS", "ScalingCurve", "assign_models", "default_scaling_dir", "load_curve",
           "load_curves", "measured_spread", "model_for"]

MAX_GPUS = 64
"""Curves cover 1..64 GPUs."""
MODELS = ("cifar10", "ncf", "deepspeech2", "bert", "yolov3", "imagenet")
_CLASSES: tuple[tuple[float, tuple[str, ...]], ...] = (
    (1.0, ("cifar10", "ncf")), (10.0, ("deepspeech2", "bert")), (100.0, ("yolov3",)), (math.inf, ("imagenet",)),
)


def default_scaling_dir() -> Path:
    """The measured curves shipped as package data (``coordinator/simulator/data/scaling``): found the same
    way in a checkout and in a pip-installed package."""
    return Path(__file__).resolve().parent / "data" / "scaling"


@dataclass(frozen=True, slots=True)
class ScalingCurve:
    """A model's true throughput by GPU count.

    :param model: the model's name.
    :param local_bsz: the per-GPU batch size every point is at.
    :param throughput: samples per second at 1..:data:`MAX_GPUS` GPUs (index ``n - 1``).
    :param measured: the GPU counts that were measured (the others are interpolated).
    :param noise: relative standard deviation of one throughput measurement (module docstring; 0: exact).
    """

    model: str
    local_bsz: int
    throughput: tuple[float, ...]
    measured: tuple[int, ...]
    noise: float = 0.0

    def at(self, gpus: int) -> float:
        """Throughput at ``gpus`` GPUs (clamped to 1..:data:`MAX_GPUS`)."""
        return self.throughput[min(max(gpus, 1), len(self.throughput)) - 1]

    def speedup(self, gpus: int) -> float:
        """Throughput at ``gpus`` over throughput at one GPU."""
        return self.at(gpus) / self.throughput[0]


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _nearest(rows: Sequence[tuple[int, float]], bsz: int) -> float:
    """Throughput per replica at ``bsz`` from ``(local_bsz, step_time)`` rows: measured at ``bsz``, else the
    throughput per replica measured at the nearest batch (module docstring)."""
    exact = [step for b, step in rows if b == bsz]
    if exact:
        return bsz / min(exact)
    near, step = min(rows, key=lambda r: (abs(math.log(r[0] / bsz)), r[0]))
    return near / step


def load_curve(model_dir: Path, max_gpus: int = MAX_GPUS) -> ScalingCurve:
    """One model's true curve from its two files (module docstring).

    :param model_dir: ``.../pollux/<model>``.
    :param max_gpus: the largest count.
    :raises OSError: a file is missing.
    :raises ValueError: the files hold no one-GPU measurement.
    """
    by_count: dict[int, dict[str, list[tuple[int, float]]]] = {}
    for r in _rows(model_dir / "placements.csv"):
        n = sum(int(c) for c in r["placement"])
        by_count.setdefault(n, {}).setdefault("p" + r["placement"], []).append(
            (int(r["local_bsz"]), float(r["step_time"])))
    for r in _rows(model_dir / "scalability.csv"):
        n = int(r["num_replicas"])
        by_count.setdefault(n, {}).setdefault(f"s{r['num_nodes']}x{n}", []).append(
            (int(r["local_bsz"]), float(r["step_time"])))
    one = by_count.get(1, {}).get("p1")
    if not one:
        raise ValueError(f"{model_dir}: no one-GPU measurement")
    groups = [rows for per in by_count.values() for rows in per.values()]
    common = set.intersection(*({b for b, _ in rows} for rows in groups))
    candidates = sorted({b for b, _ in one} & common) or sorted({b for b, _ in one})
    bsz = candidates[-1] if candidates and common else min(b for b, _ in one)
    points: dict[int, float] = {}
    for n, per in by_count.items():
        if n >= 1:
            points[n] = max(n * _nearest(rows, bsz) for rows in per.values())
    counts = sorted(points)
    out: list[float] = []
    for g in range(1, max_gpus + 1):
        out.append(_interpolate(counts, points, g))
    best = 0.0
    for i, t in enumerate(out):   # a running maximum: more GPUs never slow a job down
        best = max(best, t)
        out[i] = best
    return ScalingCurve(model_dir.name, bsz, tuple(out), tuple(c for c in counts if c <= max_gpus),
                        measured_spread(groups))


def measured_spread(groups: Iterable[Sequence[tuple[int, float]]]) -> float:
    """Relative standard deviation of one measurement, from the scatter of ``(local_bsz, step_time)`` rows about
    their batch trend, each group one placement or scale (module docstring); 0 with fewer than three batches."""
    squares: list[float] = []
    for rows in groups:
        pts = sorted(rows)
        for (b0, s0), (b1, s1), (b2, s2) in zip(pts, pts[1:], pts[2:], strict=False):
            if not (b0 < b1 < b2 and min(s0, s1, s2) > 0):
                continue
            w = math.log(b1 / b0) / math.log(b2 / b0)
            r = math.log(s1) - ((1 - w) * math.log(s0) + w * math.log(s2))
            squares.append(r * r / (1 + w * w + (1 - w) ** 2))
    return math.sqrt(sum(squares) / len(squares)) if squares else 0.0


def _interpolate(counts: Sequence[int], points: dict[int, float], g: int) -> float:
    """Log-log interpolation between the measured counts around ``g`` (power-law extension beyond them)."""
    if g in points:
        return points[g]
    below = [c for c in counts if c < g]
    above = [c for c in counts if c > g]
    if below and above:
        lo, hi = below[-1], above[0]
    elif len(below) >= 2:
        lo, hi = below[-2], below[-1]
    else:
        return points[counts[0]] * g / counts[0]
    w = math.log(g / lo) / math.log(hi / lo)
    return math.exp((1 - w) * math.log(points[lo]) + w * math.log(points[hi]))


def load_curves(scaling_dir: Path, models: Iterable[str] = MODELS) -> dict[str, ScalingCurve]:
    """Every model's curve from ``<scaling_dir>/pollux/<model>/``.

    :raises OSError: a file is missing.
    """
    return {m: load_curve(scaling_dir / "pollux" / m) for m in models}


def model_for(gpu_hours: float, rng: random.Random) -> str:
    """The model a job of ``gpu_hours`` GPU-hours gets (module docstring)."""
    for bound, pair in _CLASSES:
        if gpu_hours < bound:
            return pair[0] if len(pair) == 1 else rng.choice(pair)
    return "imagenet"   # not reached: the last bound is infinite


def assign_models(gpu_hours: Sequence[float], seed: int = 0) -> list[str]:
    """One model per job, in order, from its GPU-hours (one seeded draw per job of a two-model class)."""
    rng = random.Random(seed)
    return [model_for(h, rng) for h in gpu_hours]
