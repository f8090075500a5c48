"""Distributed Lock against a real etcd: mutual exclusion across clients, timeouts, safe release."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from common.errors import CoordinationError
from coordinator.sync import EtcdClient, Keys, Lock
from tests.integration.harness import wait_until


class TestLock:
    """Lock: one holder at a time, across independent clients."""

    def test_mutual_exclusion_across_clients(self, client_factory: Callable[[], EtcdClient], keys: Keys) -> None:
        """Four clients contending for one lock never hold it at the same time, and all get it."""
        holders: list[int] = []   # who holds the lock now
        most_at_once = 0
        done: list[int] = []
        guard = threading.Lock()

        def worker(i: int) -> None:
            nonlocal most_at_once
            with Lock(client_factory(), keys, "drain", ttl_s=5.0, holder=f"w{i}", timeout_s=30.0):
                with guard:
                    holders.append(i)
                    most_at_once = max(most_at_once, len(holders))
                time.sleep(0.1)  # hold the lock a while, so the others contend for it
                with guard:
                    holders.remove(i)
                    done.append(i)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60.0)
        assert sorted(done) == [0, 1, 2, 3]
        assert most_at_once == 1

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

    def test_release_hands_over_to_a_waiter(self, sync_client: EtcdClient, client_factory: Callable,
                                            keys: Keys) -> None:
        """A waiter that found the lock held gets it once the holder releases it, and not before."""
        holder = Lock(sync_client, keys, "move", ttl_s=5.0)
        holder.acquire()
        clock_reads = [0]

        def counting_clock() -> float:
            clock_reads[0] += 1   # once for the deadline, then once after each refused attempt
            return time.monotonic()

        waiter = Lock(client_factory(), keys, "move", ttl_s=5.0, now=counting_clock)
        acquired = threading.Event()
        thread = threading.Thread(target=lambda: (waiter.acquire(timeout=30.0), acquired.set()))
        thread.start()
        wait_until(lambda: clock_reads[0] >= 2, timeout_s=10.0, interval_s=0.01, what="the waiter to be refused once")
        assert not acquired.is_set() and not waiter.is_acquired()
        holder.release()
        assert acquired.wait(30.0)
        thread.join(timeout=5.0)
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
        """cancel() makes a blocked acquire(timeout=None) raise instead of waiting for the lock."""
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

        waiter.cancel()   # before the acquire starts or while it waits: either way it gives up
        wait_until(lambda: bool(errors), timeout_s=10.0, interval_s=0.05, what="the blocked acquire to give up")
        thread.join(timeout=10.0)
        assert "cancelled" in str(errors[0]) and not waiter.is_acquired()
        holder.release()
