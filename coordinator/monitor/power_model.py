"""Node power curves for Alg. 3: datasheet defaults, refined online by least squares.

A node's GPU power is modelled as linear in its compute utilization ``u``:
``P(u) = idle_w + (max_w - idle_w) · u``. Until a node has reported enough samples, its curve is
the datasheet one (per GPU, times the GPU count): H100 70/700 W, A100 50/400 W, L4 16/72 W,
V100 35/300 W, T4 10/70 W, P100 30/250 W; an unknown model is guessed from its memory. Once a
node has at least 30 ``(u, power)`` samples spanning at least 0.2 of utilization, an ordinary
least-squares line through its most recent samples replaces the default (unless the fit is
non-physical: a negative idle power or a non-increasing slope). The coordinator's Resource
Monitor feeds every telemetry sample in (the node's mean GPU utilization and the sum of its
GPUs' power); a node's line is refitted once 30 new samples have arrived since the last fit, so
a scheduling cycle reads cached curves instead of solving thousands of least-squares problems.

Example::

    model = PowerModel()
    model.observe("gpu-node-1", util=0.42, power_w=2310.0)
    curve = model.curve("gpu-node-1", "NVIDIA H100 80GB HBM3", gpus=8)
"""

from __future__ import annotations

import functools
import math

import numpy as np

from common.domain import PowerCurve

__all__ = [
    "DATASHEET_W", "MIN_SAMPLES", "MIN_SPAN", "REFIT_EVERY", "NodePowerFit", "PowerModel", "datasheet_curve",
    "fit_line",
]

DATASHEET_W: dict[str, tuple[float, float]] = {
    "H100": (70.0, 700.0),
    "A100": (50.0, 400.0),
    "L4": (16.0, 72.0),
    "V100": (35.0, 300.0),
    "T4": (10.0, 70.0),
    "P100": (30.0, 250.0),
}
"""(idle W, max W) per GPU, matched as a substring of the GPU model name."""

# Unknown models: (minimum memory in GiB, datasheet key) from the largest down.
_BY_MEMORY = ((80, "H100"), (40, "A100"), (24, "L4"), (16, "V100"), (0, "T4"))
MIN_SAMPLES = 30
MIN_SPAN = 0.2
REFIT_EVERY = 30   # new samples between two fits of the same node
_WINDOW = 2048
_GIB = 1024**3


@functools.lru_cache(maxsize=1024)   # a cluster has few (model, count, memory) combinations; curves are frozen
def datasheet_curve(gpu_model: str, gpus: int, mem_total_bytes: int = 0) -> PowerCurve:
    """The datasheet curve of a node with ``gpus`` GPUs of one model.

    :param gpu_model: the GPU model name (``NVIDIA A100-SXM4-80GB``).
    :param gpus: GPUs on the node.
    :param mem_total_bytes: memory of one GPU, used when the model is unknown.
    :returns: idle and max power of all the node's GPUs together (0/0 without GPUs).
    """
    name = gpu_model.upper()
    # Longest key first, so "A100" is not taken for a model that merely contains "100".
    key = next((k for k in sorted(DATASHEET_W, key=len, reverse=True) if k in name), None)
    if key is None:
        key = next(k for gib, k in _BY_MEMORY if mem_total_bytes >= gib * _GIB)
    idle, peak = DATASHEET_W[key]
    return PowerCurve(idle_w=idle * gpus, max_w=peak * gpus)


def fit_line(util: np.ndarray, power_w: np.ndarray) -> PowerCurve | None:
    """Least-squares line ``power = a + b · util`` as a curve, or None when it is unusable.

    :param util: utilizations, 0..1.
    :param power_w: powers in watts, same length.
    :returns: ``PowerCurve(a, a + b)``, or None for fewer than 2 points, no spread, ``a < 0`` or ``b ≤ 0``.
    """
    if len(util) < 2 or float(np.ptp(util)) == 0.0:
        return None
    design = np.column_stack((np.ones_like(util), util))
    (intercept, slope), *_ = np.linalg.lstsq(design, power_w, rcond=None)
    if intercept < 0 or slope <= 0:
        return None
    return PowerCurve(idle_w=float(intercept), max_w=float(intercept + slope))


class NodePowerFit:
    """The recent ``(util, power)`` samples of one node, in a fixed ring.

    The ring is allocated and written once, when the node is first seen (``2 × window`` float32:
    16 KiB at the default window), so a coordinator's memory does not creep up for half an hour
    as thousands of nodes fill their windows one Python float at a time.

    :param window: how many recent samples the fit uses.
    """

    def __init__(self, window: int = _WINDOW) -> None:
        self._ring = np.full((2, max(2, window)), 0.0, dtype=np.float32)   # rows: util, power
        self._next = 0           # where the next sample goes
        self._count = 0          # samples in the ring
        self._added = 0          # samples accepted so far
        self._fitted_at = -1     # ``_added`` when the fit was last computed (-1: never)
        self._fit: PowerCurve | None = None

    def add(self, util: float, power_w: float) -> None:
        """Add one sample (ignored when not finite or util outside 0..1).

        :param util: compute utilization, 0..1.
        :param power_w: measured power in watts.
        """
        if math.isfinite(util) and math.isfinite(power_w) and 0.0 <= util <= 1.0 and power_w >= 0:
            ring, i = self._ring, self._next
            ring[0, i] = util
            ring[1, i] = power_w
            self._next = (i + 1) % ring.shape[1]
            self._count = min(self._count + 1, ring.shape[1])
            self._added += 1

    def __len__(self) -> int:
        """Samples in the window."""
        return self._count

    def curve(self) -> PowerCurve | None:
        """The fitted curve once there are enough samples over a wide enough range, else None.

        The fit is computed when first asked for with enough samples and again once
        :data:`REFIT_EVERY` new samples have arrived; in between the last one is returned.

        :returns: the fit or None.
        """
        if self._count < MIN_SAMPLES:
            return None
        if self._fitted_at < 0 or self._added - self._fitted_at >= REFIT_EVERY:
            self._fitted_at = self._added
            self._fit = self._compute()
        return self._fit

    def _compute(self) -> PowerCurve | None:
        """Least squares over the window, when it spans enough utilization."""
        util = self._ring[0, :self._count].astype(np.float64)   # the order of samples does not matter
        if float(np.ptp(util)) < MIN_SPAN:
            return None
        return fit_line(util, self._ring[1, :self._count].astype(np.float64))


class PowerModel:
    """Per-node power curves: fitted where the samples allow, datasheet defaults otherwise."""

    def __init__(self) -> None:
        self._fits: dict[str, NodePowerFit] = {}

    def observe(self, node_id: str, util: float, power_w: float) -> None:
        """Record a node's GPU compute utilization and GPU power at one instant.

        :param node_id: the node.
        :param util: its compute utilization, 0..1 (mean over its GPUs).
        :param power_w: the sum of its GPUs' power, in watts.
        """
        fit = self._fits.get(node_id)
        if fit is None:
            fit = self._fits[node_id] = NodePowerFit()
        fit.add(util, power_w)

    def curve(self, node_id: str, gpu_model: str, gpus: int, mem_total_bytes: int = 0) -> PowerCurve:
        """The node's curve: the fit when usable, else the datasheet default.

        :param node_id: the node.
        :param gpu_model: its GPU model name.
        :param gpus: its GPU count.
        :param mem_total_bytes: memory of one of its GPUs (for unknown models).
        :returns: the curve.
        """
        return self.explain(node_id, gpu_model, gpus, mem_total_bytes)[0]

    def explain(
        self, node_id: str, gpu_model: str, gpus: int, mem_total_bytes: int = 0
    ) -> tuple[PowerCurve, str, int]:
        """The node's curve with where it comes from, for operators (``gptrmctl nodes NODE``).

        :param node_id: the node.
        :param gpu_model: its GPU model name.
        :param gpus: its GPU count.
        :param mem_total_bytes: memory of one of its GPUs (for unknown models).
        :returns: ``(curve, "fitted" or "datasheet", samples in the node's fit window)``.
        """
        fit = self._fits.get(node_id)
        fitted = fit.curve() if fit is not None else None
        samples = len(fit) if fit is not None else 0
        if fitted is not None:
            return fitted, "fitted", samples
        return datasheet_curve(gpu_model, gpus, mem_total_bytes), "datasheet", samples

    def forget(self, node_id: str) -> None:
        """Drop a node's samples (it left the cluster or its hardware changed).

        :param node_id: the node.
        """
        self._fits.pop(node_id, None)
