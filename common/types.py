"""Plain domain types shared by agent and coordinator.

Protobuf types stay at the edges; these frozen dataclasses are what policies, the
allocator, the monitor and the collectors work with.
"""

from __future__ import annotations

import enum

__all__ = [
    "DEFAULT_THRESHOLD",
    "DEFAULT_THRESHOLD_MODE",
    "MIN_POLICY_THRESHOLD",
    "TERMINAL_STATES",
    "THRESHOLD_MODES",
    "NodeState",
    "TaskKind",
    "TaskState",
    "Utilization",
]

Utilization = float
"""A fraction in 0..1 of one resource dimension."""


class TaskState(enum.IntEnum):
    """Task life cycle; values equal ``gptrm.v1.TaskState``."""

    PENDING = 1
    SCHEDULED = 2
    STARTING = 3
    RUNNING = 4
    SUCCEEDED = 5
    FAILED = 6
    CANCELLED = 7
    PAUSED = 8
    PREEMPTED = 9
    TIMEOUT = 10

    @property
    def label(self) -> str:
        """Lower-case name used in tables, JSON and metrics labels."""
        return self.name.lower()


MAX_REPORTS = 256
"""Decision acks and task-status events one agent message (``Reports``) carries at most, and decisions one
coordinator message (``Decisions``): an agent with more queued sends several."""

TERMINAL_STATES = frozenset({TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CANCELLED, TaskState.TIMEOUT})


class TaskKind(enum.IntEnum):
    """What a task does; values equal ``gptrm.v1.TaskKind``.

    ``UNSPECIFIED``: the spec did not say; shown as ``unspecified`` and profiled as inference.
    """

    UNSPECIFIED = 0
    TRAINING = 1
    FINE_TUNING = 2
    INFERENCE = 3

    @property
    def label(self) -> str:
        return self.name.lower().replace("_", "-")

    @classmethod
    def parse(cls, text: str) -> TaskKind:
        """``training`` | ``fine-tuning`` | ``inference`` | ``unspecified`` → member; ValueError otherwise."""
        for member in cls:
            if member.label == text.strip().lower().replace("_", "-"):
                return member
        raise ValueError(f"unknown task kind {text!r} (expected training, fine-tuning or inference)")


class NodeState(enum.IntEnum):
    """Node states; values equal ``gptrm.v1.NodeState``."""

    READY = 1
    NOT_READY = 2
    LOST = 3
    CORDONED = 4
    DRAINING = 5

    @property
    def label(self) -> str:
        return self.name.lower().replace("_", "-")


MIN_POLICY_THRESHOLD = 0.05
"""Smallest placement-policy threshold accepted: below it no node could take any work."""

DEFAULT_THRESHOLD = 0.9
"""Default cap on the capped dimensions' utilization after placement."""

THRESHOLD_MODES: tuple[str, ...] = ("whole-gpus", "paper")
"""Which dimensions the threshold caps: ``whole-gpus`` (host CPU, memory, disk and shared GPUs; whole GPUs may
fill a node) or ``paper`` (every dimension, GPU count included); see
:func:`coordinator.scheduler.policies.base.limit_factors`."""

DEFAULT_THRESHOLD_MODE = "whole-gpus"
"""The threshold mode unless one is set."""
