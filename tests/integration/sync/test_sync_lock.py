"""Distributed Lock against a real etcd: mutual exclusion across clients, timeouts, safe release."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable

import pytest

from common.errors import CoordinationError
from coordinator.sync import EtcdClient, Keys, Lock


class TestLock:
    """Lock: one holder at a time, across independent clients."""

    def test_mutual_exclusion_across_clients(self, client_factory: Callable[[], EtcdClient], keys: Keys) -> None:
        """Four clients contending for one lock never hold it at the same time, and all get it."""
        intervals: list[tuple[float, float]] = []
        guard = threading.Lock()

        def worker(i: int) -> None:
            with Lock(client_factory(), keys, "drain", ttl_s=5.0, holder=f"w{i}", timeout_s=10.0):
                start = time.monotonic()
                time.sleep(0.1)
                with guard:
                    intervals.append((start, time.monotonic()))

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=20.0)
        assert len(intervals) == 4
        intervals.sort()
        assert all(prev_end <= start for (_s, prev_end), (start, _e) in itertools.pairwise(intervals))

    def test_timeout_names_the_lock(self, sync_client: EtcdClient, client_factory: Callable, keys: Keys) -> None:
        """acquire raises CoordinationError naming the key and the timeout when another client holds it."""
        holder = Lock(sync_client, keys, "policy", ttl_s=5.0)
        holder.acquire(timeout=2.0)
        try:
            waiter = Lock(client_factory(), keys, "policy", ttl_s=5.0)
            with pytest.raises(CoordinationError, match=rf"lock '{keys.lock('policy')}' not acquired after 0.3s"):
                waiter.acquire(timeout=0.3)
        finally:
            assert holder.release() is True

    def test_release_hands_over_promptly(self, sync_client: EtcdClient, client_factory: Callable, keys: Keys) -> None:
        """A waiter gets the lock well within a second of the holder releasing it (it watches the key)."""
        holder = Lock(sync_client, keys, "move", ttl_s=5.0)
        holder.acquire()
        waiter = Lock(client_factory(), keys, "move", ttl_s=5.0)
        acquired_at: list[float] = []
        thread = threading.Thread(target=lambda: (waiter.acquire(timeout=5.0), acquired_at.append(time.monotonic())))
        thread.start()
        time.sleep(0.3)
        released_at = time.monotonic()
        holder.release()
        thread.join(timeout=5.0)
        assert acquired_at and acquired_at[0] - released_at < 0.4
        assert waiter.is_acquired() and not holder.is_acquired()
        waiter.release()

    def test_release_only_deletes_our_own_token(
        self, sync_client: EtcdClient, client_factory: Callable, keys: Keys
    ) -> None:
        """A holder whose lease was lost does not delete the next holder's lock when it releases."""
        lost: list[str] = []
        first = Lock(sync_client, keys, "drain", ttl_s=5.0, on_lost=lost.append)
        first.acquire()
        other = client_factory()
        lease_id = other.get(keys.lock("drain")).lease_id  # type: ignore[union-attr]
        other.revoke_lease(lease_id)  # as if first's lease expired during a partition
        second = Lock(other, keys, "drain", ttl_s=5.0)
        second.acquire(timeout=2.0)
        assert first.release() is False
        assert second.is_acquired()
        assert second.release() is True

    def test_cancel_stops_a_waiting_acquire(
        self, sync_client: EtcdClient, client_factory: Callable, keys: Keys
    ) -> None:
        """cancel() makes a blocked acquire(timeout=None) raise promptly."""
        holder = Lock(sync_client, keys, "drain", ttl_s=5.0)
        holder.acquire()
        waiter = Lock(client_factory(), keys, "drain", ttl_s=5.0)
        errors: list[Exception] = []

        def wait_forever() -> None:
            try:
                waiter.acquire(timeout=None)
            except CoordinationError as e:
                errors.append(e)

        thread = threading.Thread(target=wait_forever)
        thread.start()
        time.sleep(0.2)
        waiter.cancel()
        thread.join(timeout=2.0)
        assert errors and "cancelled" in str(errors[0])
        holder.release()
