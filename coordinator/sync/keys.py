"""etcd key names: the only place that spells them (docs/etcd.md lists the key space).

Example::

    keys = Keys()                      # prefix "/gptrm/v1/"
    keys.leader                        # '/gptrm/v1/leader'
    keys.task("t-1f3a")                # '/gptrm/v1/tasks/t-1f3a'
    keys.name_of(keys.task("t-1f3a"), keys.tasks_prefix)   # 't-1f3a'
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

from common.errors import ValidationError

__all__ = ["DEFAULT_PREFIX", "Keys"]

DEFAULT_PREFIX = "/gptrm/v1/"
"""Prefix of every gptrm key unless the coordinator is configured otherwise."""


_BAD_NAME = re.compile(r"[/\x00-\x1f]")
"""A "/" or a control character: what no name may hold."""


def _check_name(kind: str, name: str) -> str:
    # A "/" would let one id reach into another collection's range (tasks/a/b vs tasks/a). One regex
    # search instead of a loop over the characters: three keys per placement are built on the commit path.
    if not name or _BAD_NAME.search(name):
        raise ValidationError(kind, f"{name!r} is not a valid name (non-empty, no '/', no control characters)")
    return name


@dataclass(frozen=True, slots=True)
class Keys:
    """Builds every etcd key gptrm uses, under one prefix.

    :param prefix: common prefix; must start with ``/``; a missing trailing ``/`` is added.
    :raises ValidationError: the prefix does not start with ``/``.
    """

    prefix: str = DEFAULT_PREFIX

    def __post_init__(self) -> None:
        if not self.prefix.startswith("/"):
            raise ValidationError("etcd_prefix", f"{self.prefix!r} must start with '/'")
        if not self.prefix.endswith("/"):
            object.__setattr__(self, "prefix", self.prefix + "/")

    @property
    def leader(self) -> str:
        """The lease-bound key the leading coordinator holds (value: ``LeaderRecord``)."""
        return self.prefix + "leader"

    @property
    def policy(self) -> str:
        """The placement policy in force (value: ``Policy``)."""
        return self.prefix + "policy"

    @property
    def nodes_prefix(self) -> str:
        """Prefix of every ``nodes/<id>`` key."""
        return self.prefix + "nodes/"

    @property
    def tasks_prefix(self) -> str:
        """Prefix of every ``tasks/<id>`` key."""
        return self.prefix + "tasks/"

    @property
    def allocations_prefix(self) -> str:
        """Prefix of every ``allocations/<task>`` key."""
        return self.prefix + "allocations/"

    @property
    def locks_prefix(self) -> str:
        """Prefix of every ``locks/<name>`` key."""
        return self.prefix + "locks/"

    @property
    def requests_prefix(self) -> str:
        """Prefix of every ``requests/<request_id>`` key (submit idempotency; value: task id)."""
        return self.prefix + "requests/"

    @property
    def queues(self) -> str:
        """The team queues: their tree, quotas and budgets (value: the JSON of ``QueueConfig.to_dict``)."""
        return self.prefix + "queues"

    @property
    def services_prefix(self) -> str:
        """Prefix of every ``services/<id>`` key."""
        return self.prefix + "services/"

    def service(self, service_id: str) -> str:
        """``services/<service_id>`` (value: ``Service``)."""
        return self.services_prefix + _check_name("service_id", service_id)

    @property
    def service_histories_prefix(self) -> str:
        """Prefix of every ``service-history/<id>`` key (outside ``services/``, which lists the records)."""
        return self.prefix + "service-history/"

    def service_history(self, service_id: str) -> str:
        """``service-history/<service_id>`` (value: ``ServiceLoadHistory``)."""
        return self.service_histories_prefix + _check_name("service_id", service_id)

    @property
    def usage_prefix(self) -> str:
        """Prefix of every ``usage/<yyyy-mm-ddThh>`` key (one hour's usage, UTC)."""
        return self.prefix + "usage/"

    def usage_hour(self, hour_unix_s: int) -> str:
        """``usage/<yyyy-mm-ddThh>`` of the hour starting at ``hour_unix_s`` (value: ``UsageBucket``)."""
        when = datetime.fromtimestamp(hour_unix_s, tz=UTC)
        return self.usage_prefix + when.strftime("%Y-%m-%dT%H")

    @property
    def usage_marks(self) -> str:
        """How far the usage ledger has accounted (value: ``UsageMarks``)."""
        return self.prefix + "usage-marks"

    @property
    def reservations_prefix(self) -> str:
        """Prefix of every ``reservations/<name>`` key."""
        return self.prefix + "reservations/"

    def reservation(self, name: str) -> str:
        """``reservations/<name>`` (value: ``Reservation``)."""
        return self.reservations_prefix + _check_name("reservation", name)

    def node(self, node_id: str) -> str:
        """``nodes/<node_id>`` (value: ``NodeRecord``)."""
        return self.nodes_prefix + _check_name("node_id", node_id)

    def task(self, task_id: str) -> str:
        """``tasks/<task_id>`` (value: ``Task``)."""
        return self.tasks_prefix + _check_name("task_id", task_id)

    def allocation(self, task_id: str) -> str:
        """``allocations/<task_id>`` (value: ``Allocation``)."""
        return self.allocations_prefix + _check_name("task_id", task_id)

    def lock(self, name: str) -> str:
        """``locks/<name>`` (value: the holder's token)."""
        return self.locks_prefix + _check_name("lock", name)

    def request(self, request_id: str) -> str:
        """``requests/<request_id>`` (value: the id of the task that request created)."""
        return self.requests_prefix + _check_name("request_id", request_id)

    @property
    def quarantine_prefix(self) -> str:
        """Prefix of every ``quarantine/...`` key: values that failed to parse, moved aside byte for byte."""
        return self.prefix + "quarantine/"

    def quarantine(self, key: str, mod_revision: int) -> str:
        """Where the value of ``key`` (a gptrm key) at ``mod_revision`` is moved aside:
        ``quarantine/<key below the prefix>@<mod_revision>``."""
        relative = key[len(self.prefix):] if key.startswith(self.prefix) else key.lstrip("/")
        return f"{self.quarantine_prefix}{relative}@{mod_revision}"

    @staticmethod
    def name_of(key: str, collection_prefix: str) -> str:
        """The id at the end of ``key`` in the collection ``collection_prefix``.

        :raises ValueError: ``key`` is not directly inside that collection.
        """
        if not key.startswith(collection_prefix) or "/" in key[len(collection_prefix) :]:
            raise ValueError(f"key {key!r} is not in {collection_prefix!r}")
        return key[len(collection_prefix) :]
