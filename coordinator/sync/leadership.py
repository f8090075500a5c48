"""This replica's leadership as the rest of the coordinator sees it: who leads, fenced writes, etcd health.

:class:`Leadership` wraps the :class:`~coordinator.sync.Election` of one replica. It turns the
election's background-thread callbacks into calls of a :class:`LeaderRole` on the asyncio loop,
runs every fenced store write in a worker thread, and probes etcd so that an unreachable etcd
turns this replica *stale* (writes refused at once, reads served from memory) instead of
hanging requests.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol, TypeVar

from common.errors import EtcdUnavailable, NotLeader
from common.logging import get_logger
from common.pb.gptrm.v1 import agent_pb2, types_pb2
from coordinator.events import EventBus
from coordinator.sync.client import EtcdClient
from coordinator.sync.election import Election
from coordinator.sync.keys import Keys

__all__ = ["LeaderRole", "Leadership"]

R = TypeVar("R")


class LeaderRole(Protocol):
    """What a replica does when it wins or loses the leader key (see ``coordinator.app.LeaderDuties``)."""

    async def take_over(self, record: types_pb2.LeaderRecord) -> bool:
        """Rebuild the leader's view from etcd; False when that failed (the lease is then given up)."""

    def start_leading(self) -> None:
        """Start what only the leader runs (the scheduler, the reconcile after a leader change)."""

    def stand_down(self, reason: str) -> None:
        """Stop everything a leader does, at once."""


class Leadership:
    """One replica's side of the election, fenced writes and the etcd probe.

    Example::

        leadership = Leadership(client, keys, "coord-a", "10.0.0.5:7070", ttl_s=2.0, events=bus)
        leadership.start(duties, asyncio.get_running_loop())   # campaigns; duties.take_over() on a win
        task = await leadership.write(store.create_task, task, request_id)   # NotLeader on a standby

    :param client: the etcd client.
    :param keys: key names.
    :param replica_id: this coordinator's id.
    :param address: where agents and admins reach this replica.
    :param ttl_s: the leader lease TTL.
    :param events: the cluster event log (leader and etcd events).
    :param now: monotonic clock.
    """

    def __init__(self, client: EtcdClient, keys: Keys, replica_id: str, address: str, *, ttl_s: float,
                 events: EventBus, now: Callable[[], float] = time.monotonic) -> None:
        self.id = replica_id
        self.election = Election(client, keys, replica_id, address, ttl_s=ttl_s, now=now,
                                 on_lost=self._on_lost, on_elected=self._on_elected, on_observed=self._on_observed)
        self._events = events
        self.leading = False
        self.epoch = 0
        self.stale = False
        self._role: LeaderRole | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # Set (and replaced) whenever the leader key changes or this replica starts leading.
        self._leader_changed = asyncio.Event()
        self._log = get_logger("coordinator").bind(leader_id=replica_id)

    # ---- election -----------------------------------------------------------------------------

    def start(self, role: LeaderRole, loop: asyncio.AbstractEventLoop) -> None:
        """Start campaigning; ``role`` is told when this replica wins or loses."""
        self._role, self._loop = role, loop
        self.election.start()

    async def resign(self) -> None:
        """Give the leader key up (a clean shutdown) and stop acting at once."""
        await asyncio.to_thread(self.election.resign)
        self._stop_leading("shutdown")

    def _on_elected(self, record: types_pb2.LeaderRecord) -> None:
        if self._loop is not None:
            asyncio.run_coroutine_threadsafe(self._take_over(record), self._loop)

    def _on_observed(self, record: types_pb2.LeaderRecord | None) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._signal_leader_changed)

    def _signal_leader_changed(self) -> None:
        changed, self._leader_changed = self._leader_changed, asyncio.Event()
        changed.set()

    def _on_lost(self, reason: str) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._stop_leading, reason)

    async def _take_over(self, record: types_pb2.LeaderRecord) -> None:
        assert self._role is not None
        try:
            ok = await self._role.take_over(record)
        except Exception as e:   # a take-over must never leave a lease holder that does not lead
            self._log.exception("take_over_failed", reason=repr(e))
            self.step_down(f"take-over failed: {type(e).__name__}")
            return
        if not ok or not self.election.is_leader:
            return
        self.epoch = record.epoch
        self.leading = True
        self.stale = False
        self._log.info("leadership_acquired", epoch=record.epoch)
        self._signal_leader_changed()
        self._events.publish("leader", f"{self.id} leads (epoch {record.epoch})", leader_id=self.id,
                             epoch=record.epoch)
        self._role.start_leading()

    def _stop_leading(self, reason: str) -> None:
        if not self.leading:
            return
        self.leading = False
        if self._role is not None:
            self._role.stand_down(reason)
        self._log.warning("leadership_lost", reason=reason)
        self._events.publish("leader", f"{self.id} stopped leading: {reason}", leader_id=self.id, reason=reason)

    def step_down(self, reason: str) -> None:
        """Give up a leadership this replica cannot exercise (e.g. recovery failed)."""
        self.election.step_down(reason)

    @property
    def is_leader(self) -> bool:
        """Leading in memory and still holding the lease (what ``GetStatus.is_leader`` reports)."""
        return self.leading and self.election.is_leader

    def leader_info(self) -> tuple[str, str, int]:
        """(leader id, leader address, epoch) as last observed."""
        # The election's own view (watch + campaigns) costs no etcd read; ask etcd only when it has none.
        rec = self.election.observe() or self.election.leader()
        if rec is None:
            return "", "", 0
        return rec.coordinator_id, rec.address, rec.epoch

    def require_leader(self) -> None:
        """:raises NotLeader: with the leader's address when this replica is a standby."""
        if not self.is_leader:
            leader_id, address, _ = self.leader_info()
            raise NotLeader(f"{self.id} is not the leader" + (f"; the leader is {leader_id} at {address}"
                                                                if leader_id else "; no leader elected yet"),
                            leader_id, address)

    def redirect_message(self) -> agent_pb2.CoordinatorMessage:
        """What a standby (or a leader stepping down) tells an agent: where the leader is, if known."""
        leader_id, address, _ = self.leader_info()
        if leader_id == self.id:
            leader_id, address = "", ""
        return agent_pb2.CoordinatorMessage(redirect=agent_pb2.Redirect(leader_address=address, leader_id=leader_id))

    async def hold_after_loss(self, lost_epoch: int, timeout_s: float) -> agent_pb2.CoordinatorMessage | None:
        """An agent asks this standby; its session with the leader of ``lost_epoch`` just broke (0: none did).

        Sending it back to that leader (what a standby's view shows until the lease expires) would
        cost it a failed connection and a backoff per try while the leader is being replaced; so it
        is held here until a leader of another epoch is known, or ``timeout_s`` passed (the leader
        was alive after all: only the agent's stream broke). Likewise while no leader is known, or
        while this replica is taking over. An agent that lost nothing is sent at once to a leader
        the key names. Returns None when this replica leads meanwhile (serve the agent here), else
        the redirect to send.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not self.leading:
            seen = self.election.observe()   # kept current by the election's watch: no etcd read per agent
            if seen is not None and seen.coordinator_id != self.id and seen.epoch != lost_epoch:
                break   # another replica leads now
            # No leader yet, the lost one still on the key, or this replica taking over: wait.
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            changed = self._leader_changed   # the leader key changed, or this replica's take-over ended
            try:
                await asyncio.wait_for(changed.wait(), timeout=remaining)
            except TimeoutError:
                break
        return None if self.leading else self.redirect_message()

    # ---- fenced writes ------------------------------------------------------------------------

    async def write(self, fn: Callable[..., R], *args: object, **kwargs: object) -> R:
        """Run a fenced store write in a thread; etcd trouble marks our view stale.

        :raises NotLeader: this replica does not lead.
        :raises EtcdUnavailable: etcd is known to be unreachable (refused at once, nothing is
            half-applied) or stopped answering during the write.
        """
        self.require_leader()
        if self.stale:
            raise EtcdUnavailable("etcd is unreachable: writes are refused until it answers again "
                                  "(reads are served from memory, marked stale)")
        return await self.write_as_leader(fn, *args, **kwargs)

    async def write_as_leader(self, fn: Callable[..., R], *args: object, **kwargs: object) -> R:
        """Like :meth:`write` without the in-memory leader check (used during take-over); fencing still applies."""
        try:
            result = await asyncio.to_thread(fn, *args, **kwargs)
        except EtcdUnavailable as e:
            self._set_etcd_reachable(False, str(e))
            raise
        self._set_etcd_reachable(True)
        return result

    # ---- etcd health --------------------------------------------------------------------------

    def _set_etcd_reachable(self, up: bool, reason: str = "") -> None:
        if up == (not self.stale):
            return
        self.stale = not up
        if up:
            self._log.info("etcd_recovered")
            self._events.publish("etcd", "etcd reachable again: writes and scheduling resume")
        else:
            self._log.warning("etcd_unreachable", reason=reason)
            self._events.publish("etcd", f"etcd unreachable: scheduling and writes stop, reads are stale ({reason})")

    async def watch_etcd(self, on_recovered: Callable[[], None], period_s: float = 0.5) -> None:
        """Probe etcd (a read of the leader key) every ``period_s``, on every replica.

        While it does not answer, this replica is *stale*: the scheduler pauses, writes are
        refused with ``UNAVAILABLE``, and reads are served from memory with ``stale`` set. The
        first answer clears it, with no operator action, and calls ``on_recovered`` (the
        scheduler's wake-up). (An outage longer than the lease TTL also costs the leader its
        lease; it then steps down, and leads again after re-election.)
        """
        while True:
            was_stale = self.stale
            try:
                await asyncio.to_thread(self.election.leader)
            except EtcdUnavailable as e:
                self._set_etcd_reachable(False, str(e))
            except Exception as e:  # etcd answered with an error: it is reachable
                self._log.warning("etcd_probe_failed", reason=str(e))
                self._set_etcd_reachable(True)
            else:
                self._set_etcd_reachable(True)
            if was_stale and not self.stale:
                on_recovered()
            await asyncio.sleep(period_s)

