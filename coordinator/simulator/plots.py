"""PNG plots of replays: utilization, power and queue length over time; CDF of completion times.

matplotlib is imported lazily (only when a plot is drawn) with the ``Agg`` backend, so the
simulator itself needs no display and no plotting library.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from coordinator.simulator.engine import SimResult

__all__ = ["plot_all", "step_resample"]

_POINTS = 1500
_DAY_S = 86_400.0
# (file stem, Series attribute, y label, scale)
_TIME_PLOTS = (
    ("utilization", "util_mean", "mean compute utilization of powered nodes (Eq. 1)", 1.0),
    ("power", "power_w", "cluster power, kW (Eq. 3)", 1e-3),
    ("queue", "queue_len", "jobs waiting", 1.0),
)


def step_resample(t: np.ndarray, y: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Values of a step function (``y[k]`` holds from ``t[k]`` on) at the grid times.

    :param t: sample times, ascending.
    :param y: values.
    :param grid: times to evaluate at.
    :returns: one value per grid time (the first value before ``t[0]``).
    """
    idx = np.searchsorted(t, grid, side="right") - 1
    return y[np.clip(idx, 0, len(y) - 1)]


def _pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (imported on first use)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _time_plot(out: Path, results: Mapping[str, SimResult], stem: str, attr: str, label: str, scale: float) -> Path:
    """One over-time plot with a line per run."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for name, result in results.items():
        series = result.series
        if series is None or not series.t_s:
            continue
        t = np.asarray(series.t_s)
        grid = np.linspace(t[0], t[-1], _POINTS)
        y = step_resample(t, np.asarray(getattr(series, attr), dtype=np.float64), grid) * scale
        ax.plot((grid - t[0]) / _DAY_S, y, label=name, linewidth=0.9, drawstyle="steps-post")
    ax.set_xlabel("days since the first submission")
    ax.set_ylabel(label)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    path = out / f"{stem}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _cdf_plot(out: Path, results: Mapping[str, SimResult]) -> Path:
    """CDF of job completion times (submit → end), log x axis."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, result in results.items():
        jct = np.sort(np.array([r.end_s - r.submit_s for r in result.jobs], dtype=np.float64))
        if len(jct) == 0:
            continue
        ax.plot(np.maximum(jct, 1.0), np.arange(1, len(jct) + 1) / len(jct), label=name, linewidth=1.0)
    ax.set_xscale("log")
    ax.set_xlabel("job completion time, s (log)")
    ax.set_ylabel("fraction of jobs")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "jct_cdf.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_all(out: Path, results: Mapping[str, SimResult]) -> list[Path]:
    """Draw every plot into ``out``.

    :param out: an existing directory.
    :param results: run name → result (runs without a series are left out of the time plots).
    :returns: the PNG files written.
    """
    paths = [_time_plot(out, results, *spec) for spec in _TIME_PLOTS]
    paths.append(_cdf_plot(out, results))
    return paths
