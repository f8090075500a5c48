"""QoS Manager (paper §3): what a task is owed once it was admitted — today the restart policy;
priorities that preempt, deadlines and service-level objectives build on it."""

from __future__ import annotations

from coordinator.qos.restart import DEFAULT_MAX_RESTARTS, RestartPolicy

__all__ = ["DEFAULT_MAX_RESTARTS", "RestartPolicy"]
