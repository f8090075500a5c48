"""QoS Manager (paper §3): what a task is owed once it was admitted — the restart policy
(:mod:`~coordinator.qos.restart`) and priorities that preempt (:mod:`~coordinator.qos.preemption`,
imported where used: it builds on the scheduler's modules)."""

from __future__ import annotations

from coordinator.qos.restart import DEFAULT_MAX_RESTARTS, RestartPolicy

__all__ = ["DEFAULT_MAX_RESTARTS", "RestartPolicy"]
