"""Replay of a diurnal inference load against three ways to size a service: static MAX replicas, reactive
(HPA formula) only, and predictive (max of reactive and the Holt-Winters forecast). Simulated time.

The trace is synthesized in the shape of the Azure LLM inference trace 2023 (Patel et al., "Splitwise",
ISCA 2024; github.com/Azure/AzurePublicDataset, AzureLLMInferenceTrace): a daily cycle with a working-day
peak about 4x the night trough, a faster rise in the morning than the fall in the evening, and bursty
minute-to-minute noise (here ±10 %, seeded); the morning rise is made steep (45 minutes) to stress the
replicas' start-up time. Five days at one-minute steps; the first two days warm the
forecaster (two seasons) and are not scored.

Model: each replica serves ``CAPACITY`` requests in flight at the latency target; the latency target is
violated in a minute when the in-flight load exceeds ``CAPACITY`` × ready replicas. A replica asked for
becomes ready ``STARTUP_S`` later (model load); it is reserved (counts toward GPU-hours, one GPU each)
from the decision on. The controller ticks every 30 s and uses the production decision code
(``coordinator.adaptor.autoscale`` and ``coordinator.adaptor.forecast``) with its default windows.

Run: ``.venv/bin/python tests/bench/bench_services.py``.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from coordinator.adaptor.autoscale import Autoscaler, ScalePolicy  # noqa: E402
from coordinator.adaptor.forecast import LoadHistory  # noqa: E402

MIN, MAX = 1, 24
CAPACITY = 8.0            # requests in flight one replica serves within the latency target
TARGET = 0.7              # the scaling target: in-flight load / capacity of the ready replicas
STARTUP_S = 300.0         # decision to ready (a large model loading)
TICK_S = 30.0
DAY_S = 86_400.0
DAYS, WARM_DAYS = 5, 2


def trace(seed: int = 7) -> np.ndarray:
    """Requests in flight at each minute of ``DAYS`` days (see the module docstring for the shape)."""
    rng = np.random.default_rng(seed)
    minutes = np.arange(int(DAYS * DAY_S / 60))
    hour = (minutes / 60.0) % 24
    # Asymmetric day: a steep rise 08:00-08:45, a plateau, a slow decline into the night.
    day = np.where(hour < 8, 0.0, np.where(hour < 8.75, (hour - 8) / 0.75, np.where(hour < 17, 1.0,
                   np.maximum(0.0, 1 - (hour - 17) / 7))))
    smooth = np.convolve(day, np.ones(11) / 11, mode="same")
    load = 25.0 + 75.0 * smooth
    return np.maximum(0.0, load * (1 + 0.10 * rng.standard_normal(len(load))))


@dataclass
class Result:
    name: str
    gpu_hours: float
    violated: float
    actions: int


def replay(name: str, load: np.ndarray, *, mode: str) -> Result:
    """One policy over the trace; only the days after the warm-up are scored."""
    now = [0.0]
    scaler = Autoscaler(ScalePolicy(min_replicas=MIN, max_replicas=MAX), clock=lambda: now[0])
    history = LoadHistory(bucket_s=300.0, season_buckets=int(DAY_S / 300))
    desired = MAX if mode == "static" else MIN
    ready_at: list[float] = [0.0] * desired          # one entry per reserved replica
    gpu_s = violated_min = scored_min = 0.0
    actions = 0
    warm_s = WARM_DAYS * DAY_S
    for minute, inflight in enumerate(load):
        for half in range(int(60 / TICK_S)):
            now[0] = t = minute * 60.0 + half * TICK_S
            ready = sum(1 for r in ready_at if r <= t)
            if mode != "static":
                history.add(t, float(inflight))
                signal = inflight / (max(ready, 1) * CAPACITY)
                forecast = None
                if mode == "predictive":
                    f = history.forecast(t, STARTUP_S)
                    if f.model != "none":
                        forecast = math.ceil(f.peak / (CAPACITY * TARGET))
                d = scaler.decide(desired, signal, TARGET, forecast_replicas=forecast)
                if d.acted and d.desired != desired:
                    actions += t >= warm_s
                    if d.desired > desired:
                        ready_at += [t + STARTUP_S] * (d.desired - desired)
                    else:   # stop the newest first (the ones still starting go before the ready ones)
                        ready_at = sorted(ready_at)[: d.desired]
                    desired = d.desired
            if t >= warm_s:
                gpu_s += len(ready_at) * TICK_S
        if minute * 60.0 >= warm_s:
            scored_min += 1
            ready = sum(1 for r in ready_at if r <= minute * 60.0)
            violated_min += inflight > ready * CAPACITY
    return Result(name, gpu_s / 3600.0, violated_min / scored_min, actions)


def main() -> None:
    load = trace()
    started = time.perf_counter()
    results = [replay("static MAX", load, mode="static"), replay("reactive", load, mode="reactive"),
               replay("predictive", load, mode="predictive")]
    elapsed = time.perf_counter() - started
    scored_days = DAYS - WARM_DAYS
    print(f"diurnal trace, {scored_days} scored days, peak {load.max():.0f} in flight, capacity {CAPACITY:g}/replica,"
          f" startup {STARTUP_S:.0f} s, MIN..MAX {MIN}..{MAX}")
    print(f"{'policy':<12} {'GPU-hours':>10} {'vs static':>10} {'violated':>9} {'actions/day':>12}")
    static = results[0].gpu_hours
    for r in results:
        print(f"{r.name:<12} {r.gpu_hours:>10.1f} {100 * (r.gpu_hours / static - 1):>9.1f}% "
              f"{100 * r.violated:>8.2f}% {r.actions / scored_days:>12.1f}")
    print(f"replayed in {elapsed:.1f} s")


if __name__ == "__main__":
    main()
