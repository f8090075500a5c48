"""Placement policies, looked up by name in one registry.

``policy set NAME`` selects from :data:`POLICIES`; every factory has the signature
``build(threshold: float = 0.9, *, seed: int | None = None, mode: str = "whole-gpus") -> Policy``
(only ``random`` uses the seed; ``mode`` is the threshold mode, see
:func:`~coordinator.scheduler.policies.base.limit_factors`). Nothing registers itself on import.

Example::

    policy = POLICIES["power-efficient"](threshold=0.85)
"""

from __future__ import annotations

from collections.abc import Callable

from common.errors import ValidationError
from coordinator.scheduler.policies import (
    first_fit,
    load_balancing,
    max_utilization,
    power_efficient,
    random_policy,
    round_robin,
    time_aware,
)
from coordinator.scheduler.policies.base import (
    DEFAULT_THRESHOLD,
    DEFAULT_THRESHOLD_MODE,
    THRESHOLD_MODES,
    NodeArrays,
    Policy,
    PolicyArgs,
    feasible,
)

__all__ = ["DEFAULT_THRESHOLD", "DEFAULT_THRESHOLD_MODE", "POLICIES", "THRESHOLD_MODES", "NodeArrays", "Policy",
           "PolicyArgs", "PolicyFactory", "build", "feasible"]

PolicyFactory = Callable[..., Policy]
"""``build(threshold, *, seed, mode) -> Policy``."""

POLICIES: dict[str, PolicyFactory] = {
    max_utilization.NAME: max_utilization.build,
    load_balancing.NAME: load_balancing.build,
    power_efficient.NAME: power_efficient.build,
    round_robin.NAME: round_robin.build,
    random_policy.NAME: random_policy.build,
    first_fit.NAME: first_fit.build,
    time_aware.NAME: time_aware.build,
}


def build(name: str, threshold: float = DEFAULT_THRESHOLD, *, seed: int | None = None,
          mode: str = DEFAULT_THRESHOLD_MODE) -> Policy:
    """Build a policy by name.

    :param name: a key of :data:`POLICIES`.
    :param threshold: cap on every dimension's utilization after placement, in (0, 1].
    :param seed: RNG seed for ``random`` (ignored by the others).
    :param mode: which dimensions the threshold caps (:data:`THRESHOLD_MODES`).
    :returns: the policy.
    :raises ValidationError: on an unknown name or invalid arguments.
    """
    factory = POLICIES.get(name)
    if factory is None:
        raise ValidationError("policy.name", f"unknown policy {name!r} (known: {', '.join(sorted(POLICIES))})")
    return factory(threshold, seed=seed, mode=mode)
