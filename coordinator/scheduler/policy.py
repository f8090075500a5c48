"""The placement policy in force: which of the registered policies, its threshold and threshold mode."""

from __future__ import annotations

import math

from common.errors import ValidationError
from common.pb.gptrm.v1 import types_pb2
from common.types import MIN_POLICY_THRESHOLD
from coordinator.events import EventBus
from coordinator.scheduler.policies import DEFAULT_THRESHOLD_MODE, POLICIES, THRESHOLD_MODES
from coordinator.scheduler.wakeup import Wakeup
from coordinator.sync.leadership import Leadership
from coordinator.sync.lock import AdminLocks
from coordinator.sync.store import Store

__all__ = ["PolicySetting", "threshold_mode"]


def threshold_mode(policy: types_pb2.Policy) -> str:
    """The threshold mode a policy record means ("" — a record written before modes existed — is the default).

    :param policy: a policy record.
    :returns: one of ``THRESHOLD_MODES``.
    """
    return policy.threshold_mode or DEFAULT_THRESHOLD_MODE


class PolicySetting:
    """The cluster's placement policy, persisted in etcd (``policy``) and read by every cycle.

    A change takes the ``policy`` etcd lock, so two admins (or two replicas during a leader
    change) never interleave their changes.

    Example::

        await setting.set(types_pb2.Policy(name="power-efficient", threshold=0.8))
        setting.current.name     # "power-efficient"

    :param name: the policy at start-up, until etcd holds one.
    :param threshold: its threshold.
    :param mode: its threshold mode.
    :param store: the fenced etcd store.
    :param leadership: leader check and fenced writes.
    :param locks: the admin locks.
    :param events: the cluster event log.
    :param wakeup: the scheduler's wake-up signal.
    """

    def __init__(self, name: str, threshold: float, store: Store, leadership: Leadership, locks: AdminLocks,
                 events: EventBus, wakeup: Wakeup, mode: str = DEFAULT_THRESHOLD_MODE) -> None:
        self.current = types_pb2.Policy(name=name, threshold=threshold, threshold_mode=mode)
        self._store, self._leadership, self._locks = store, leadership, locks
        self._events, self._wakeup = events, wakeup

    @staticmethod
    def validate(policy: types_pb2.Policy) -> None:
        """:raises ValidationError: the name is not a registered policy, or the threshold mode is unknown."""
        if policy.name not in POLICIES:
            raise ValidationError("name", f"unknown policy {policy.name!r} (known: {', '.join(sorted(POLICIES))})")
        if policy.threshold_mode and policy.threshold_mode not in THRESHOLD_MODES:
            raise ValidationError("threshold_mode", f"must be one of {', '.join(THRESHOLD_MODES)}, "
                                                    f"got {policy.threshold_mode!r}")

    @classmethod
    def check_stored(cls, policy: types_pb2.Policy) -> None:
        """Whether a policy read from etcd can be used: a registered name and a threshold in
        [``MIN_POLICY_THRESHOLD``, 1] (what ``SetPolicy`` accepts).

        :raises ValidationError: naming the field.
        """
        cls.validate(policy)
        if not math.isfinite(policy.threshold) or not MIN_POLICY_THRESHOLD <= policy.threshold <= 1:
            raise ValidationError("threshold", f"must be in [{MIN_POLICY_THRESHOLD}, 1], got {policy.threshold}")

    async def set(self, policy: types_pb2.Policy) -> types_pb2.Policy:
        """Validate, persist under the ``policy`` lock, and apply from the next cycle.

        :raises ValidationError: unknown policy.
        :raises NotLeader: on a standby.
        :raises CoordinationError: the lock was held elsewhere too long.
        """
        self._leadership.require_leader()
        self.validate(policy)

        async def change() -> None:   # stored and in force together, even if the caller goes away meanwhile
            await self._leadership.write(self._store.put_policy, policy)
            self.current = policy

        await self._locks.run("policy", change)
        mode = threshold_mode(policy)
        self._events.publish("policy", f"policy {policy.name} threshold {policy.threshold:.2f} ({mode})",
                             policy=policy.name, threshold=policy.threshold, threshold_mode=mode)
        self._wakeup.set()
        return policy

    def adopt(self, stored: types_pb2.Policy | None) -> bool:
        """Take the policy a new leader read from etcd; False when etcd had none (ours should be written)."""
        if stored is None or not stored.name:
            return False
        self.current = stored
        return True
