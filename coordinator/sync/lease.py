"""Leases kept alive in the background, and the claim/release-a-key recipe built on them.

``Election`` and ``Lock`` are both "put a key bound to a :class:`Lease` with a transaction
that requires ``create_revision == 0``; delete it only while it is still ours".
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from types import TracebackType

from common.errors import CoordinationError
from common.logging import get_logger
from coordinator.sync.client import KV, EtcdClient, cmp_create, cmp_value, op_delete, op_get, op_put

__all__ = ["Lease", "claim_key", "release_key"]

_RETRY_S = 0.1
"""Pause before retrying a failed keep-alive: short, since the local deadline is running."""


class Lease:
    """An etcd lease refreshed every ``ttl_s / 3`` that declares itself expired *before* etcd would.

    Example::

        lease = Lease(client, ttl_s=2.0, on_expired=lambda reason: stop_acting(reason))
        lease_id = lease.acquire()
        client.txn([cmp_create(key, 0)], [op_put(key, b"me", lease_id)])
        lease.release()          # revokes: keys bound to it vanish now, not after ttl_s

    The local expiry estimate is ``t + 0.9 * ttl_s`` where ``t`` is when the last successful
    keep-alive was *sent*: etcd renewed the lease no earlier than that, so the estimate never
    lies beyond etcd's own expiry (the 10 % absorbs clock-rate differences). When no
    keep-alive succeeds by then, a watchdog thread calls ``on_expired(reason)`` once, logs
    ``lease_expired`` and revokes the lease so whoever waits for its keys need not wait out
    the TTL. A keep-alive that etcd answers with TTL 0 (revoked, or expired there) does the same.

    :param client: the etcd client.
    :param ttl_s: lease time-to-live; etcd counts whole seconds, so it is rounded up there.
    :param on_expired: called (on a background thread) when the lease is lost; not on release.
    :param now: monotonic clock for the deadline arithmetic.
    :param refresh_hook: called on the refresh thread before each keep-alive; tests block it
        to play a stalled process (a long GC pause, a frozen VM).
    """

    def __init__(
        self,
        client: EtcdClient,
        ttl_s: float = 2.0,
        *,
        on_expired: Callable[[str], None] | None = None,
        now: Callable[[], float] = time.monotonic,
        refresh_hook: Callable[[], None] | None = None,
    ) -> None:
        if not ttl_s > 0:
            raise ValueError(f"lease ttl_s {ttl_s} must be positive")
        self._client = client
        self._ttl_s = float(ttl_s)
        self._on_expired = on_expired
        self._now = now
        self._refresh_hook = refresh_hook
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._expired = False
        self._id = 0
        self._local_ttl = 0.9 * self._ttl_s
        self._deadline = 0.0
        self._threads: list[threading.Thread] = []
        self._log = get_logger("sync")

    @property
    def id(self) -> int:
        """The etcd lease id (0 before :meth:`acquire`)."""
        return self._id

    @property
    def ttl_s(self) -> float:
        """The requested time-to-live."""
        return self._ttl_s

    @property
    def deadline(self) -> float:
        """Local expiry estimate on the ``now`` clock."""
        with self._lock:
            return self._deadline

    @property
    def alive(self) -> bool:
        """Granted, neither released nor expired, and the local deadline has not passed."""
        return bool(self._id) and not self._stopped.is_set() and self._now() < self.deadline

    @property
    def expired(self) -> bool:
        """The lease was lost (as opposed to released)."""
        return self._expired

    def acquire(self) -> int:
        """Grant the lease and start keeping it alive.

        :returns: the lease id.
        :raises EtcdUnavailable: etcd did not answer.
        :raises CoordinationError: etcd refused the grant, or the lease was already acquired.
        """
        if self._id:
            raise CoordinationError(f"lease {self._id} already acquired")
        sent = self._now()
        self._id, granted = self._client.grant_lease(max(1, math.ceil(self._ttl_s)))
        self._local_ttl = 0.9 * min(self._ttl_s, float(granted))
        with self._lock:
            self._deadline = sent + self._local_ttl
        for target, role in ((self._refresh_loop, "refresh"), (self._watchdog_loop, "watchdog")):
            thread = threading.Thread(target=target, name=f"gptrm-lease-{role}-{self._id:x}", daemon=True)
            self._threads.append(thread)
            thread.start()
        self._log.debug("lease_granted", lease_id=self._id, ttl_s=granted)
        return self._id

    def release(self) -> None:
        """Stop refreshing and revoke; never raises (an unrevoked lease expires after ``ttl_s``)."""
        self.cancel()
        self._revoke_quietly()

    def cancel(self) -> None:
        """Stop refreshing without revoking: the lease runs out on etcd's clock."""
        self._stopped.set()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(timeout=self._client.timeout_s + 1.0)

    def __enter__(self) -> Lease:
        self.acquire()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()

    def _refresh_loop(self) -> None:
        attempt = 0
        while not self._stopped.wait(self._ttl_s / 3 if attempt == 0 else _RETRY_S):
            if self._refresh_hook is not None:
                self._refresh_hook()
            sent = self._now()
            remaining = self.deadline - sent
            if self._stopped.is_set() or remaining <= 0:
                return  # stopped, or past the deadline: the watchdog reports it
            try:
                ttl = self._client.refresh_lease(self._id, timeout_s=remaining)
            except CoordinationError as e:
                attempt += 1
                self._log.warning("lease_refresh_failed", lease_id=self._id, attempt=attempt, reason=str(e))
                continue
            if ttl <= 0:
                self._expire(f"lease {self._id} no longer exists on etcd (revoked or expired)")
                return
            attempt = 0
            with self._lock:
                self._deadline = max(self._deadline, sent + self._local_ttl)

    def _watchdog_loop(self) -> None:
        while True:
            remaining = self.deadline - self._now()
            if remaining <= 0:
                break
            if self._stopped.wait(remaining):
                return
        self._expire(f"lease {self._id} not refreshed within {self._local_ttl:.2f}s (local estimate of its expiry)")

    def _expire(self, reason: str) -> None:
        with self._lock:
            if self._stopped.is_set():
                return
            self._stopped.set()
            self._expired = True
        self._log.warning("lease_expired", lease_id=self._id, reason=reason)
        if self._on_expired is not None:
            try:
                self._on_expired(reason)
            except Exception:  # a faulty callback must not keep the lease's keys alive
                self._log.exception("lease_callback_failed", lease_id=self._id)
        self._revoke_quietly()

    def _revoke_quietly(self) -> None:
        if not self._id:
            return
        try:
            self._client.revoke_lease(self._id)
        except CoordinationError as e:
            self._log.warning("lease_revoke_failed", lease_id=self._id, reason=str(e))


def claim_key(client: EtcdClient, key: str, value: bytes, lease_id: int) -> tuple[bool, KV | None]:
    """Create ``key`` = ``value`` bound to ``lease_id`` if, and only if, the key does not exist.

    :returns: (True, the key as written) when we created it, or when it already holds our
        value on our lease (a retried claim whose first answer was lost); otherwise (False,
        the current holder's key, or None when it vanished meanwhile).
    :raises EtcdUnavailable: etcd did not answer.
    """
    result = client.txn([cmp_create(key, 0)], [op_put(key, value, lease_id), op_get(key)], [op_get(key)])
    found = result.responses[1] if result.succeeded else result.responses[0]
    kv = found[0] if found else None
    if result.succeeded:
        return True, kv
    return (kv is not None and kv.lease_id == lease_id and kv.value == value), kv


def release_key(client: EtcdClient, key: str, value: bytes) -> bool:
    """Delete ``key`` only if it still holds ``value`` (our token); True when it was deleted."""
    return client.txn([cmp_value(key, value)], [op_delete(key)]).succeeded
