"""Leader election on the etcd leader key (docs/etcd.md)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import TracebackType

from common.errors import CoordinationError, NotLeader
from common.logging import get_logger
from common.pb.gptrm.v1 import types_pb2
from coordinator.sync._records import decode
from coordinator.sync.client import KV, EtcdClient, WatchEvent, WatchHandle, cmp_create, op_delete, op_put
from coordinator.sync.keys import Keys
from coordinator.sync.lease import Lease, claim_key

__all__ = ["Election"]


def _record(kv: KV) -> types_pb2.LeaderRecord:
    record = decode(types_pb2.LeaderRecord, kv)
    record.epoch = kv.create_revision  # the epoch *is* the create revision, whatever the value says
    return record


class Election:
    """Campaign for the leader key; exactly one candidate holds it, and so leads.

    Example::

        election = Election(client, keys, "coord-a", "10.0.0.5:7070", ttl_s=2.0, on_lost=stop_acting)
        election.start()                              # campaign (and watch) in the background
        if election.wait_for_leadership(timeout=5.0):
            store = Store(client, keys, election)     # its writes are fenced with election.epoch
            serve_as_leader(store)                    # act while leading
        election.resign()                             # clean shutdown: a standby takes over at once

    A candidate wins with a transaction that requires the leader key's create revision to be 0
    and puts a ``LeaderRecord`` bound to its :class:`Lease`; its *epoch* is the key's create
    revision, which ``Store`` compares in every write (fencing). Standbys watch the key and
    campaign as soon as it is deleted (resign, revoke, expiry), and also poll every ``ttl_s / 2``
    in case the watch broke. The leader refreshes its lease every ``ttl_s / 3``; if no refresh
    succeeds before its local estimate of the expiry (90 % of ``ttl_s`` after the last
    successful refresh was sent) it steps down at once, before etcd expires the key: it logs
    ``leadership_lost``, calls ``on_lost(reason)``, revokes the lease and waits ``ttl_s``
    before campaigning again, so that a healthy standby wins first. The leader learns of a loss
    from its refreshes, its local deadline, or a write refused by fencing (:meth:`step_down`);
    it does not watch its own key.

    TTL trade-off: a crashed leader is replaced ``ttl_s`` after its last refresh (a clean
    :meth:`resign` or a revoke is immediate, well under a second), so a short TTL means fast
    failover; but any stall longer than ~0.9 × ``ttl_s`` — a GC pause, a swapped-out process,
    an etcd fsync or raft election slower than that — deposes a healthy leader (a false
    failover, with a full recovery on the new leader). etcd counts TTLs in whole seconds and
    enforces a minimum (1.5 × its election timeout), so 2 s is the practical floor; 2–5 s
    suits a LAN, 10 s or more suits etcd across zones or hosts with long pauses.

    :param client: the etcd client.
    :param keys: key names (the leader key is ``keys.leader``).
    :param candidate_id: this coordinator's id (``LeaderRecord.coordinator_id``).
    :param address: where agents and admins reach this coordinator (``LeaderRecord.address``).
    :param ttl_s: lease TTL, see the trade-off above.
    :param now: monotonic clock for the lease deadline.
    :param on_lost: called with a reason when leadership is lost (not on :meth:`resign`), on a
        background thread; the coordinator must stop acting as leader at once.
    :param on_elected: called with our ``LeaderRecord`` when this candidate wins, on a background thread.
    :param wall: wall clock for ``LeaderRecord.since_unix_s``.
    :param on_observed: called with the leader record seen on the key (None: deleted) each time the
        watch reports a change, on a background thread.
    :param refresh_hook: passed to :class:`Lease` (tests stall it to play a GC pause).
    """

    def __init__(
        self,
        client: EtcdClient,
        keys: Keys,
        candidate_id: str,
        address: str,
        ttl_s: float = 2.0,
        now: Callable[[], float] = time.monotonic,
        *,
        on_lost: Callable[[str], None] | None = None,
        on_elected: Callable[[types_pb2.LeaderRecord], None] | None = None,
        wall: Callable[[], float] = time.time,
        refresh_hook: Callable[[], None] | None = None,
        on_observed: Callable[[types_pb2.LeaderRecord | None], None] | None = None,
    ) -> None:
        if not ttl_s > 0:
            raise ValueError(f"election ttl_s {ttl_s} must be positive")
        self._client, self._keys, self._id, self._address = client, keys, candidate_id, address
        self._ttl_s, self._now, self._wall = float(ttl_s), now, wall
        self._on_lost, self._on_elected, self._refresh_hook = on_lost, on_elected, refresh_hook
        self._on_observed = on_observed
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._leading = False
        self._epoch: int | None = None
        self._lease: Lease | None = None
        self._observed: types_pb2.LeaderRecord | None = None
        self._not_before = 0.0
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._watch: WatchHandle | None = None
        self._log = get_logger("sync").bind(leader_id=candidate_id, key=keys.leader)

    @property
    def candidate_id(self) -> str:
        """This candidate's coordinator id."""
        return self._id

    @property
    def ttl_s(self) -> float:
        """The lease TTL."""
        return self._ttl_s

    @property
    def is_leader(self) -> bool:
        """We hold the leader key and our lease's local deadline has not passed."""
        with self._lock:
            return self._leading and self._lease is not None and self._lease.alive

    @property
    def epoch(self) -> int | None:
        """Our epoch (the leader key's create revision) while we lead, else None."""
        with self._lock:
            leading = self._leading and self._lease is not None and self._lease.alive
            return self._epoch if leading else None

    @property
    def lease_id(self) -> int | None:
        """Our leader lease id while we lead, else None."""
        with self._lock:
            return self._lease.id if self._leading and self._lease is not None else None

    def require_epoch(self) -> int:
        """Our epoch; the fencing token every leader write compares.

        :raises NotLeader: we do not lead (the error names the leader we last saw, if any).
        """
        epoch = self.epoch
        if epoch is not None:
            return epoch
        seen = self.observe()
        who = f"the leader is {seen.coordinator_id!r} at {seen.address}" if seen else "no leader is known"
        raise NotLeader(
            f"coordinator {self._id!r} is not the leader; {who}",
            leader_id=seen.coordinator_id if seen else "",
            leader_address=seen.address if seen else "",
        )

    def leader(self) -> types_pb2.LeaderRecord | None:
        """Read the current leader from etcd (``epoch`` = the key's create revision); None when there is none.

        :raises EtcdUnavailable: etcd did not answer.
        """
        kv = self._client.get(self._keys.leader)
        self._observe_kv(kv)
        return None if kv is None else _record(kv)

    def observe(self) -> types_pb2.LeaderRecord | None:
        """The leader this candidate last saw (through its watch, campaigns or :meth:`leader`); no I/O."""
        with self._lock:
            seen = self._observed
        return None if seen is None else types_pb2.LeaderRecord.FromString(seen.SerializeToString())

    def start(self) -> None:
        """Join the election: campaign now and whenever the leader key goes away. Idempotent."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name=f"gptrm-election-{self._id}", daemon=True)
            self._thread.start()

    def acquire(self, timeout: float | None = None) -> bool:
        """:meth:`start`, then :meth:`wait_for_leadership`."""
        self.start()
        return self.wait_for_leadership(timeout)

    def wait_for_leadership(self, timeout: float | None = None) -> bool:
        """Block until we lead or ``timeout`` seconds pass; True when we lead."""
        with self._changed:
            self._changed.wait_for(lambda: self._leading, timeout)
        return self.is_leader

    def step_down(self, reason: str) -> None:
        """Stop leading now (``Store`` calls this when fencing refuses a write); calls ``on_lost``."""
        self._lose(None, reason)

    def resign(self) -> None:
        """Leave the election; if we lead, delete the leader key (only if still ours) and revoke the lease.

        Never raises: a key that cannot be deleted expires with the lease after ``ttl_s``.
        """
        self._stop.set()
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=2 * self._client.timeout_s + self._ttl_s)
        with self._changed:
            leading, epoch, lease = self._leading, self._epoch, self._lease
            self._leading, self._epoch, self._lease = False, None, None
            watch, self._watch = self._watch, None
            self._changed.notify_all()
        if watch is not None:
            watch.cancel()
        if not leading or lease is None or epoch is None:
            return
        try:
            self._client.txn([cmp_create(self._keys.leader, epoch)], [op_delete(self._keys.leader)])
        except CoordinationError as e:
            self._log.warning("leader_key_delete_failed", lease_id=lease.id, revision=epoch, reason=str(e))
        lease.release()
        self._log.info("leadership_resigned", lease_id=lease.id, revision=epoch)

    def release(self) -> None:
        """Same as :meth:`resign` (the recipe vocabulary: acquire/release/cancel)."""
        self.resign()

    def cancel(self) -> None:
        """Same as :meth:`resign`: stop campaigning, and give up leadership if we hold it."""
        self.resign()

    def __enter__(self) -> Election:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.resign()

    def _run(self) -> None:
        attempt = 0
        while not self._stop.is_set():
            self._wake.clear()
            self._ensure_watch()
            if not self.is_leader and self._now() >= self._not_before:
                try:
                    self._campaign()
                    attempt = 0
                except CoordinationError as e:
                    attempt += 1
                    self._log.warning("campaign_failed", attempt=attempt, reason=str(e))
                except Exception:  # a bug: log it, but keep campaigning, or this standby never takes over
                    attempt += 1
                    self._log.exception("campaign_failed", attempt=attempt)
            with self._lock:
                leading, backoff = self._leading, self._not_before - self._now()
            # Standbys poll at ttl/2 in case the watch broke; after a loss, they wait out the backoff.
            pause = self._ttl_s if leading else min(self._ttl_s / 2, backoff) if backoff > 0 else self._ttl_s / 2
            self._wake.wait(pause)

    def _campaign(self) -> None:
        kv = self._client.get(self._keys.leader)
        if kv is not None:
            self._observe_kv(kv)
            return
        lease = Lease(
            self._client,
            self._ttl_s,
            on_expired=lambda reason: self._lose(lease, reason),  # runs after acquire(), so `lease` is bound
            now=self._now,
            refresh_hook=self._refresh_hook,
        )
        lease_id = lease.acquire()
        record = types_pb2.LeaderRecord(coordinator_id=self._id, address=self._address, since_unix_s=self._wall())
        try:
            won, held = claim_key(self._client, self._keys.leader, record.SerializeToString(), lease_id)
        except CoordinationError:
            lease.release()
            raise
        if not won or held is None:
            lease.release()
            self._observe_kv(held)
            return
        record.epoch = held.create_revision
        with self._changed:
            if self._stop.is_set() or not lease.alive:
                won = False  # resigning meanwhile, or the lease lapsed during the claim
            else:
                self._leading, self._epoch, self._lease = True, record.epoch, lease
                self._observed = types_pb2.LeaderRecord.FromString(record.SerializeToString())
                self._changed.notify_all()
        if not won:
            lease.release()
            return
        self._store_epoch(record, lease_id)
        self._log.info("leadership_acquired", lease_id=lease_id, revision=record.epoch)
        if self._on_elected is not None:
            try:
                self._on_elected(record)
            except Exception:  # the callback's failure must not kill the campaign thread
                self._log.exception("election_callback_failed", revision=record.epoch)

    def _store_epoch(self, record: types_pb2.LeaderRecord, lease_id: int) -> None:
        # The epoch is only known once the key exists; write it into the value for operators
        # (etcdctl get) — readers take it from the create revision anyway.
        try:
            self._client.txn(
                [cmp_create(self._keys.leader, record.epoch)],
                [op_put(self._keys.leader, record.SerializeToString(), lease_id)],
            )
        except CoordinationError as e:
            self._log.warning("leader_record_update_failed", lease_id=lease_id, revision=record.epoch, reason=str(e))

    def _lose(self, lease: Lease | None, reason: str) -> None:
        with self._changed:
            if not self._leading or (lease is not None and lease is not self._lease):
                return
            old, epoch = self._lease, self._epoch
            self._leading, self._epoch, self._lease = False, None, None
            self._not_before = self._now() + self._ttl_s
            self._changed.notify_all()
        self._log.warning("leadership_lost", lease_id=old.id if old else None, revision=epoch, reason=reason)
        if self._on_lost is not None:
            try:
                self._on_lost(reason)
            except Exception:  # stepping down must complete even if the callback fails
                self._log.exception("election_callback_failed", revision=epoch)
        if lease is None and old is not None:
            old.release()  # stepping down on our own: revoke so a standby need not wait out the TTL
        self._wake.set()

    def _ensure_watch(self) -> None:
        with self._lock:
            if self._watch is not None:
                return
        try:
            handle = self._client.watch(self._keys.leader, self._on_watch)
        except CoordinationError as e:
            self._log.warning("watch_failed", reason=str(e))
            return
        with self._lock:
            self._watch = handle

    def _on_watch(self, events: list[WatchEvent] | None) -> None:
        if events is None:
            with self._lock:
                self._watch = None  # broken stream: the campaign loop registers a new watch
            self._wake.set()
            return
        for event in events:
            if event.kind == "delete":
                self._observe_kv(None)
                self._wake.set()
            else:
                self._observe_kv(event.kv)

    def _observe_kv(self, kv: KV | None) -> None:
        record = None if kv is None else _record(kv)
        with self._lock:
            self._observed = record
        if self._on_observed is not None:
            self._on_observed(record)
