"""A distributed lock for admin operations (drain, policy change, manual moves)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from types import TracebackType
from typing import TypeVar

from common.errors import CoordinationError
from common.logging import get_logger
from coordinator.sync.client import EtcdClient, WatchEvent, WatchHandle
from coordinator.sync.keys import Keys
from coordinator.sync.lease import Lease, claim_key, release_key

__all__ = ["AdminLocks", "Lock", "settle"]

R = TypeVar("R")


async def settle(work: Awaitable[R]) -> R:
    """Await ``work`` to its end even when the caller is cancelled meanwhile; the cancellation is then
    raised once ``work`` has ended (its result or error dropped: the caller is gone).

    What must happen together or not at all (an etcd write and its application to the leader's memory,
    taking or giving back a lock) runs through this, so that a cancelled call (a client's deadline passing
    in the middle of an admin change) never leaves one half done.
    """
    task = asyncio.ensure_future(work)
    cancelled = False
    while not task.done():
        try:
            await asyncio.wait([task])   # waiting is cancelled, the task is not
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        if not task.cancelled():
            task.exception()   # retrieved: its error, if any, went to no one
        raise asyncio.CancelledError
    return task.result()


class Lock:
    """A mutex across processes: one holder of ``locks/<name>`` at a time.

    Example::

        with Lock(client, keys, "drain", ttl_s=10.0, holder="coord-a", timeout_s=5.0):
            drain(node)                         # no other admin operation holds "drain"

        lock = Lock(client, keys, "policy")
        lock.acquire(timeout=5.0)    # CoordinationError: lock '/gptrm/v1/locks/policy' not acquired after 5.0s
        try:
            change_policy()
        finally:
            lock.release()

    Acquire is the same recipe as ``Election``: a transaction that requires the key's create
    revision to be 0 puts our token bound to a :class:`Lease`; waiters watch the key and try
    again as soon as it is deleted. The lease is kept alive while we hold the lock, so an
    operation may outlast ``ttl_s``; if the holder dies, the lock frees itself ``ttl_s`` later.
    If the lease is lost while held (etcd unreachable for ~``ttl_s``), ``on_lost(reason)`` is
    called and :attr:`held` turns False: the holder must assume someone else may now hold it.
    Release deletes the key only while it still holds our token (a uuid).

    Error handling: :meth:`acquire` raises ``CoordinationError`` on timeout (and
    ``EtcdUnavailable`` when etcd does not answer); :meth:`release` never raises, since an
    unreleased lock expires with its lease.

    :param client: the etcd client.
    :param keys: key names (the lock key is ``keys.lock(name)``).
    :param name: lock name (``drain``, ``policy``, ...).
    :param ttl_s: lease TTL: how long a dead holder blocks others.
    :param holder: readable prefix of the token (e.g. the coordinator id), for operators.
    :param timeout_s: how long ``with lock:`` waits to acquire (None: forever).
    :param on_lost: called when the lock's lease is lost while held.
    :param now: monotonic clock for timeouts and the lease deadline.
    """

    def __init__(
        self,
        client: EtcdClient,
        keys: Keys,
        name: str,
        ttl_s: float = 10.0,
        *,
        holder: str = "",
        timeout_s: float | None = 10.0,
        on_lost: Callable[[str], None] | None = None,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client, self._key, self._ttl_s, self._now, self._on_lost = client, keys.lock(name), ttl_s, now, on_lost
        self._token = f"{holder}:{uuid.uuid4().hex}".encode() if holder else uuid.uuid4().hex.encode()
        self._lease: Lease | None = None
        self._cancelled = threading.Event()
        self._wake = threading.Event()   # set when the key is deleted, or on cancel(): a waiting acquire retries
        self._timeout_s = timeout_s
        self._log = get_logger("sync").bind(key=self._key)

    @property
    def key(self) -> str:
        """The etcd key of this lock."""
        return self._key

    @property
    def held(self) -> bool:
        """We acquired the lock and its lease is still alive (local view, no I/O)."""
        lease = self._lease
        return lease is not None and lease.alive

    def is_acquired(self) -> bool:
        """Ask etcd whether the lock key holds our token."""
        kv = self._client.get(self._key)
        return kv is not None and kv.value == self._token

    def acquire(self, timeout: float | None = 10.0) -> None:
        """Block until we hold the lock.

        :param timeout: seconds to wait; None waits until acquired or :meth:`cancel` is called.
        :raises CoordinationError: ``lock KEY not acquired after Ns``, or cancelled (also by a :meth:`cancel`
            made before this call started), or already held by us.
        :raises EtcdUnavailable: etcd did not answer.
        """
        if self._lease is not None:
            raise CoordinationError(f"lock {self._key!r} is already held by this Lock object")
        deadline = None if timeout is None else self._now() + timeout
        freed = self._wake

        def on_change(events: list[WatchEvent] | None) -> None:
            if events is None or any(e.kind == "delete" for e in events):
                freed.set()

        watch: WatchHandle | None = None
        try:
            watch = self._client.watch(self._key, on_change)
        except CoordinationError as e:  # polling below still works, only slower
            self._log.warning("watch_failed", reason=str(e))
        try:
            attempt = 0
            while self._cancelled.is_set() or not self._try_acquire():
                if self._cancelled.is_set():
                    raise CoordinationError(f"lock {self._key!r}: acquire cancelled after {attempt} attempts")
                attempt += 1
                remaining = None if deadline is None else deadline - self._now()
                if remaining is not None and remaining <= 0:
                    raise CoordinationError(f"lock {self._key!r} not acquired after {timeout}s")
                freed.wait(min(remaining, 0.5) if remaining is not None else 0.5)
                freed.clear()
        finally:
            self._cancelled.clear()   # spent: a later acquire of this object waits again
            if watch is not None:
                watch.cancel()
        self._log.info("lock_acquired", lease_id=self._lease.id if self._lease else None, attempt=attempt + 1)

    def _try_acquire(self) -> bool:
        if self._client.get(self._key) is not None:
            return False  # held by someone: do not grant a lease just to be refused
        lease = Lease(self._client, self._ttl_s, on_expired=self._lost, now=self._now)
        lease_id = lease.acquire()
        try:
            won, _held = claim_key(self._client, self._key, self._token, lease_id)
        except CoordinationError:
            lease.release()
            raise
        if not won:
            lease.release()
            return False
        self._lease = lease
        return True

    def _lost(self, reason: str) -> None:
        self._log.warning("lock_lost", reason=reason)
        if self._on_lost is not None:
            self._on_lost(reason)

    def release(self) -> bool:
        """Delete the lock key if it still holds our token, and revoke our lease; never raises.

        :returns: True when we held the lock and deleted its key.
        """
        lease, self._lease = self._lease, None
        if lease is None:
            return False
        try:
            deleted = release_key(self._client, self._key, self._token)
        except CoordinationError as e:
            self._log.warning("lock_release_failed", lease_id=lease.id, reason=str(e))
            deleted = False
        lease.release()  # revoking also deletes the key if it is still bound to our lease
        self._log.info("lock_released", lease_id=lease.id)
        return deleted

    def cancel(self) -> None:
        """Make a pending :meth:`acquire` (on another thread) give up at once, or the next one if none is
        under way yet (a cancel that races the acquire's start is not lost)."""
        self._cancelled.set()
        self._wake.set()

    def __enter__(self) -> Lock:
        self.acquire(self._timeout_s)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


class AdminLocks:
    """The named locks admin operations hold (``drain``, ``policy``), so that two replicas, or two
    admins on one, never interleave the same kind of change.

    Example::

        locks = AdminLocks(client, keys, holder="coord-a")
        async with locks.hold("policy"):
            await change_policy()        # CoordinationError when another holder kept it for timeout_s
        await locks.run("queues", change_queues)   # the change runs to its end even if the caller goes away

    A lock is never left behind by a cancelled caller (an admin call whose client gave up): a caller
    cancelled while the lock is being taken makes the taking give up, waits for it, and gives back
    whatever it got; giving back runs to its end whatever happens to the caller. So the lock is free
    again when the holder's call ends, not when its lease expires (which, kept alive, it never would).

    :param client: the etcd client.
    :param keys: key names.
    :param holder: readable prefix of each lock's token (the coordinator id).
    :param ttl_s: lease TTL of each lock.
    :param timeout_s: how long :meth:`hold` waits to acquire.
    """

    def __init__(self, client: EtcdClient, keys: Keys, *, holder: str, ttl_s: float = 10.0,
                 timeout_s: float = 5.0) -> None:
        self._client, self._keys, self._holder = client, keys, holder
        self._ttl_s, self._timeout_s = ttl_s, timeout_s

    @contextlib.asynccontextmanager
    async def hold(self, name: str) -> AsyncIterator[None]:
        """Hold ``locks/<name>`` for the body (blocking etcd calls run in a worker thread).

        The body itself may be cancelled part-way (:meth:`run` when it must not be).

        :raises CoordinationError: not acquired within ``timeout_s``.
        :raises EtcdUnavailable: etcd did not answer.
        """
        lock = Lock(self._client, self._keys, name, self._ttl_s, holder=self._holder, timeout_s=self._timeout_s)
        acquiring = asyncio.ensure_future(asyncio.to_thread(lock.acquire, self._timeout_s))
        try:
            await asyncio.shield(acquiring)
        except asyncio.CancelledError:
            lock.cancel()
            await settle(self._give_back(lock, acquiring))
            raise
        try:
            yield
        finally:
            await settle(asyncio.to_thread(lock.release))

    @staticmethod
    async def _give_back(lock: Lock, acquiring: asyncio.Future[None]) -> None:
        """After a cancelled :meth:`hold`: wait for the acquiring thread to end, then release what it got."""
        with contextlib.suppress(Exception):   # refused or cancelled: nothing to give back
            await acquiring
        await asyncio.to_thread(lock.release)   # a no-op unless the thread took the lock after all

    async def run(self, name: str, change: Callable[[], Awaitable[R]]) -> R:
        """Hold ``locks/<name>`` while ``change()`` runs; once the lock is taken the change runs to its end
        even if the caller is cancelled meanwhile (:func:`settle`), so an etcd write and its application to
        memory are never separated by a client's deadline. A caller cancelled before the lock is taken
        changes nothing.

        :raises CoordinationError: not acquired within ``timeout_s``.
        :raises EtcdUnavailable: etcd did not answer.
        """
        async with self.hold(name):
            return await settle(change())
