"""Node power curves for Alg. 3: datasheet defaults, refined online by least squares.

A node's GPU power is modelled as linear in its compute utilization ``u``:
``P(u) = idle_w + (max_w - idle_w) · u``. Until a node has reported enough samples, its curve is
the datasheet one (per GPU, times the GPU count): H100 70/700 W, A100 50/400 W, L4 16/72 W,
V100 35/300 W, T4 10/70 W, P100 30/250 W; an unknown model is guessed from its memory. Once a
node has at least 30 ``(u, power)`` samples spanning at least 0.2 of utilization, an ordinary
least-squares line through its most recent samples (about the last 2,048, kept as
per-chunk sums: see :class:`NodePowerFit`) replaces the default (unless the fit is
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

from coordinator.domain import PowerCurve

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
_CHUNKS = 32   # a fit window is kept as this many chunks of sums
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
    """The recent ``(util, power)`` samples of one node, kept as the sums a least-squares line needs.

    The window is cut into :data:`_CHUNKS` chunks of ``ceil(window / _CHUNKS)`` samples; each
    closed chunk keeps its count, Σu, Σp, Σu², Σu·p and its lowest and highest utilization (one
    row of a float64 array allocated once: 1.8 KiB per node, where the samples themselves took
    16 KiB at the default window), the open chunk the same in Python floats. The fit uses the
    open chunk and as many of the newest closed chunks as keep it within ``window`` samples, so
    the window slides a chunk at a time: between ``window - chunk`` and ``window`` samples once full
    (exactly ``window`` when a chunk has just closed and the chunk size divides it).

    :param window: how many recent samples the fit uses, at most.
    """

    def __init__(self, window: int = _WINDOW) -> None:
        window = max(2, window)
        self._chunk = max(1, math.ceil(window / _CHUNKS))    # samples per chunk
        self._nchunks = max(1, window // self._chunk)         # closed chunks kept
        self._closed = np.zeros((self._nchunks, 7))           # rows: n, Σu, Σp, Σu², Σu·p, min u, max u
        self._next = 0           # the row the open chunk goes to when it closes
        self._nclosed = 0        # closed chunks held
        self._open = [0.0, 0.0, 0.0, 0.0, 0.0, math.inf, -math.inf]
        self._added = 0          # samples accepted so far
        self._fitted_at = -1     # ``_added`` when the fit was last computed (-1: never)
        self._fit: PowerCurve | None = None

    def add(self, util: float, power_w: float) -> None:
        """Add one sample (ignored when not finite or util outside 0..1).

        :param util: compute utilization, 0..1.
        :param power_w: measured power in watts.
        """
        if math.isfinite(util) and math.isfinite(power_w) and 0.0 <= util <= 1.0 and power_w >= 0:
            o = self._open
            o[0] += 1.0
            o[1] += util
            o[2] += power_w
            o[3] += util * util
            o[4] += util * power_w
            if util < o[5]:
                o[5] = util
            if util > o[6]:
                o[6] = util
            self._added += 1
            if o[0] >= self._chunk:
                self._closed[self._next] = o
                self._next = (self._next + 1) % self._nchunks
                self._nclosed = min(self._nclosed + 1, self._nchunks)
                self._open = [0.0, 0.0, 0.0, 0.0, 0.0, math.inf, -math.inf]

    def _used(self) -> int:
        """Closed chunks the fit uses: the newest ones that, with the open chunk, stay within the window."""
        return min(self._nclosed, self._nchunks - (1 if self._open[0] else 0))

    def __len__(self) -> int:
        """Samples in the window."""
        return int(self._open[0]) + self._used() * self._chunk

    def curve(self) -> PowerCurve | None:
        """The fitted curve once there are enough samples over a wide enough range, else None.

        The fit is computed when first asked for with enough samples and again once
        :data:`REFIT_EVERY` new samples have arrived; in between the last one is returned.

        :returns: the fit or None.
        """
        if len(self) < MIN_SAMPLES:
            return None
        if self._fitted_at < 0 or self._added - self._fitted_at >= REFIT_EVERY:
            self._fitted_at = self._added
            self._fit = self._compute()
        return self._fit

    def _compute(self) -> PowerCurve | None:
        """Least squares over the window, when it spans enough utilization: from the sums,
        slope = cov(u, p) / var(u) and intercept = mean(p) − slope · mean(u)."""
        k = self._used()
        rows = self._closed[(np.arange(k) + (self._next - k)) % self._nchunks]
        n, su, sp, suu, sup = (float(rows[:, j].sum()) + self._open[j] for j in range(5))
        lo = min(float(rows[:, 5].min()) if k else math.inf, self._open[5])
        hi = max(float(rows[:, 6].max()) if k else -math.inf, self._open[6])
        if n < 2 or hi - lo < MIN_SPAN:
            return None
        var = suu - su * su / n
        if var <= 0.0:
            return None
        slope = (sup - su * sp / n) / var
        intercept = (sp - slope * su) / n
        if intercept < 0 or slope <= 0:
            return None
        return PowerCurve(idle_w=intercept, max_w=intercept + slope)


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
