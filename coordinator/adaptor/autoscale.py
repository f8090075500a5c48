"""A service's replica-count decision: reactive (Kubernetes' HPA formula) and predictive, without flapping.

Pure logic over an injected clock; the controller (``services.py``) feeds it one observation per tick.

- **Reactive**: ``desired = ceil(current * signal / target)`` (for a throughput floor the ratio is
  ``target / signal``: fewer tokens/s than wanted means more replicas). A ratio within ``tolerance`` of 1
  keeps the count (HPA's 10 % band).
- **Predictive**: the forecast's replica count is a floor: ``desired = max(reactive, forecast)``.
- **Scale-down stabilization**: the count goes down only to the highest recommendation of the last
  ``stabilization_s`` seconds, so it goes down only after the signal stayed low that long.
- **Cooldown**: no action within ``cooldown_s`` of the previous one (a scale-up always waits ``up_cooldown_s``).
- **Bounded actions**: at most ``max_actions`` actions per ``actions_window_s``.
- **Missing signal**: no reading means the count stays where it is, and the reason says so.

Example::

    scaler = Autoscaler(ScalePolicy(min_replicas=1, max_replicas=4), clock=time.monotonic)
    d = scaler.decide(current=2, signal=0.9, target=0.6)   # Decision(desired=3, reason='signal 0.9 ...')
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Autoscaler", "Decision", "ScalePolicy", "hpa_desired"]


@dataclass(frozen=True, slots=True)
class ScalePolicy:
    """How a service scales.

    :param min_replicas: never fewer.
    :param max_replicas: never more.
    :param tolerance: a signal/target ratio within this of 1 changes nothing.
    :param stabilization_s: scale-down looks back this long and keeps the highest recommendation.
    :param cooldown_s: no action within this long of the previous one.
    :param up_cooldown_s: a scale-up waits only this long after the previous action (faster than down).
    :param max_actions: actions allowed per ``actions_window_s``.
    :param actions_window_s: the window of ``max_actions``.
    """

    min_replicas: int
    max_replicas: int
    tolerance: float = 0.1
    stabilization_s: float = 300.0
    cooldown_s: float = 60.0
    up_cooldown_s: float = 30.0
    max_actions: int = 6
    actions_window_s: float = 600.0

    def clamp(self, n: int) -> int:
        """``n`` within [min_replicas, max_replicas]."""
        return max(self.min_replicas, min(self.max_replicas, n))


@dataclass(frozen=True, slots=True)
class Decision:
    """What the autoscaler wants: the count and why (``acted`` when it differs from the current one)."""

    desired: int
    reason: str
    acted: bool = False


def hpa_desired(current: int, signal: float, target: float, *, tolerance: float = 0.1,
                higher_is_worse: bool = True) -> int:
    """Kubernetes HPA: the count that brings ``signal`` to ``target``.

    :param current: replicas now (at least 1 is assumed when 0).
    :param signal: the mean signal over the replicas (utilization, latency), or their throughput.
    :param target: the signal's target.
    :param tolerance: ratios within ``1 ± tolerance`` keep ``current``.
    :param higher_is_worse: True for utilization and latency; False for a throughput floor.
    """
    current = max(1, current)
    if target <= 0 or not math.isfinite(signal) or signal < 0:
        return current
    throughput_ratio = target / signal if signal > 0 else math.inf
    ratio = signal / target if higher_is_worse else throughput_ratio
    if abs(ratio - 1.0) <= tolerance:
        return current
    if math.isinf(ratio):
        return current + 1
    return max(1, math.ceil(current * ratio - 1e-9))


class Autoscaler:
    """One service's decisions over time.

    :param policy: bounds, windows and tolerance.
    :param clock: monotonic seconds (injected; tests pass a fake).
    """

    def __init__(self, policy: ScalePolicy, clock: Callable[[], float]) -> None:
        self.policy = policy
        self._clock = clock
        self._recommendations: deque[tuple[float, int]] = deque()
        self._actions: deque[float] = deque()
        self._last_action = -math.inf

    def note_action(self) -> None:
        """Record an action taken outside :meth:`decide` (an admin's pin); it starts the cooldown."""
        now = self._clock()
        self._last_action = now
        self._actions.append(now)

    def decide(self, current: int, signal: float | None, target: float, *, higher_is_worse: bool = True,
               forecast_replicas: int | None = None, signal_name: str = "signal") -> Decision:
        """The count to run now.

        :param current: the count the controller keeps now.
        :param signal: the signal now; None when no replica's metrics could be read (the count freezes).
        :param target: its target.
        :param higher_is_worse: see :func:`hpa_desired`.
        :param forecast_replicas: what the forecast needs within the lead time (a floor), or None.
        :param signal_name: how the reason names the signal.
        """
        p, now = self.policy, self._clock()
        if signal is None:
            return Decision(current, f"{signal_name} unavailable: count frozen at {current}")
        reactive = p.clamp(hpa_desired(current, signal, target, tolerance=p.tolerance,
                                       higher_is_worse=higher_is_worse))
        want = reactive
        why = f"{signal_name} {signal:.3g} vs target {target:.3g}: reactive {reactive}"
        if forecast_replicas is not None:
            forecast = p.clamp(forecast_replicas)
            why += f", forecast {forecast}"
            want = max(want, forecast)
        # Scale-down stabilization: the highest recommendation of the window.
        self._recommendations.append((now, want))
        while self._recommendations and self._recommendations[0][0] < now - p.stabilization_s:
            self._recommendations.popleft()
        if want < current:
            stable = max(r for _, r in self._recommendations)
            if stable > want:
                why += f"; scale-down held by the {p.stabilization_s:.0f} s stabilization window at {stable}"
                want = min(current, stable)
        want = p.clamp(want)
        if want == current:
            return Decision(current, why)
        # Cooldown and the action bound.
        since = now - self._last_action
        cooldown = p.up_cooldown_s if want > current else p.cooldown_s
        if since < cooldown:
            return Decision(current, why + f"; in cooldown ({since:.0f} s of {cooldown:.0f} s since the last action)")
        while self._actions and self._actions[0] < now - p.actions_window_s:
            self._actions.popleft()
        if len(self._actions) >= p.max_actions:
            return Decision(current, why + f"; action bound reached ({p.max_actions} per {p.actions_window_s:.0f} s)")
        self._last_action = now
        self._actions.append(now)
        return Decision(want, why + f": {current} → {want}", acted=True)
