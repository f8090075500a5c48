"""The gptrm error hierarchy.

Library exceptions (grpc, etcd, pynvml, psutil) are turned into these at the module that
calls the library (``raise ... from e``); only process boundaries catch and report them.
"""

from __future__ import annotations

__all__ = [
    "CollectorError",
    "ConfigError",
    "CoordinationError",
    "EtcdUnavailable",
    "Fenced",
    "GptrmError",
    "IllegalTransition",
    "LeaseExpired",
    "NoData",
    "NotFound",
    "NotLeader",
    "PermissionDenied",
    "PlacementError",
    "Unavailable",
    "UsageError",
    "ValidationError",
]


class GptrmError(Exception):
    """Base of every error gptrm raises on purpose."""


class ConfigError(GptrmError):
    """Configuration is invalid: the message names the field, the value and its source."""


class ValidationError(GptrmError):
    """A request or spec is invalid.

    :param field: dotted path of the offending field (``spec.model.params_billions``).
    :param problem: what is wrong with it.
    """

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


class NotFound(GptrmError):
    """A node, task or key that the request names does not exist."""


class PermissionDenied(GptrmError):
    """The caller is authenticated, but its credentials do not allow what it asked for (a queue
    its credential does not name). The Admin API answers PERMISSION_DENIED and audits the refusal.

    :param message: what was refused and what the caller may do instead.
    :param principal: the caller's name, for the audit record.
    :param role: the caller's role, for the audit record.
    """

    def __init__(self, message: str, principal: str = "", role: str = "") -> None:
        super().__init__(message)
        self.principal = principal
        self.role = role


class Unavailable(GptrmError):
    """What the request needs (a node's agent) cannot be reached now; trying later may work."""


class CoordinationError(GptrmError):
    """Coordination through etcd failed."""


class NotLeader(CoordinationError):
    """This coordinator is not the leader; ``leader_address`` says who is, if known."""

    def __init__(self, message: str, leader_id: str = "", leader_address: str = "") -> None:
        super().__init__(message)
        self.leader_id = leader_id
        self.leader_address = leader_address


class Fenced(CoordinationError):
    """A write was refused because this coordinator no longer holds the leader key."""


class LeaseExpired(CoordinationError):
    """The leader lease could not be refreshed before it expired."""


class EtcdUnavailable(CoordinationError):
    """etcd did not answer in time."""


class IllegalTransition(CoordinationError):
    """A task state change that the state machine does not allow, or a lost race."""


class PlacementError(GptrmError):
    """A task cannot be placed; the message is the human-readable reason."""


class CollectorError(GptrmError):
    """A telemetry collector failed this round."""


class NoData(GptrmError):
    """A collector has nothing to report this round; not a failure."""


class UsageError(GptrmError):
    """A command line asked for something impossible (a bad flag value, an unreadable input file);
    command-line tools report it in one line with exit code 2."""
