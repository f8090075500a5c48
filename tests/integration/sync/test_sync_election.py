"""Leader election against a real etcd: one leader, handover, early step-down."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
from structlog.testing import capture_logs

from common.errors import NotLeader
from coordinator.sync import Election, EtcdClient, Keys

MakeElection = Callable[..., Election]


def wait_until(predicate: Callable[[], bool], timeout: float) -> bool:
    """Poll ``predicate`` every 10 ms until it holds or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


class TestElection:
    """Election: exactly one leader, handover on resign, epochs from the leader key."""

    def test_one_of_many_candidates_leads(self, make_election: MakeElection) -> None:
        """Of four candidates started together exactly one leads, and all agree on who."""
        candidates = [make_election(f"coord-{i}") for i in range(4)]
        for c in candidates:
            c.start()
        assert wait_until(lambda: any(c.is_leader for c in candidates), 30.0)
        record = candidates[0].leader()
        assert record is not None
        seen = lambda: [getattr(c.observe(), "coordinator_id", None) for c in candidates]  # noqa: E731
        assert wait_until(lambda: seen() == [record.coordinator_id] * 4, 30.0)
        # Every candidate has seen the winner's key, so every other campaign has been refused.
        leaders = [c for c in candidates if c.is_leader]
        assert [c.candidate_id for c in leaders] == [record.coordinator_id]
        assert record.address == f"{leaders[0].candidate_id}.test:7070"
        assert record.epoch == leaders[0].epoch

    def test_epoch_is_the_leader_key_create_revision(
        self, make_election: MakeElection, sync_client: EtcdClient, keys: Keys
    ) -> None:
        """The epoch equals the leader key's create revision, and the stored record carries it too."""
        election = make_election("coord-a")
        assert election.acquire(timeout=5.0)
        kv = sync_client.get(keys.leader)
        assert kv is not None
        assert election.epoch == kv.create_revision
        assert kv.lease_id == election.lease_id
        assert wait_until(lambda: election.leader().epoch == kv.create_revision, 2.0)  # type: ignore[union-attr]

    def test_resign_hands_over_to_the_standby(self, make_election: MakeElection) -> None:
        """After the leader resigns the standby leads (how fast is measured by tests/bench/bench_failover.py)."""
        first, second = make_election("coord-a"), make_election("coord-b")
        assert first.acquire(timeout=5.0)
        second.start()
        assert wait_until(lambda: getattr(second.observe(), "coordinator_id", None) == "coord-a", 30.0)
        assert not second.is_leader
        first.resign()
        assert second.wait_for_leadership(timeout=30.0)
        assert not first.is_leader
        assert getattr(second.leader(), "coordinator_id", None) == "coord-b"

    def test_resign_leaves_another_leaders_key_alone(
        self, make_election: MakeElection, sync_client: EtcdClient, keys: Keys
    ) -> None:
        """A standby that resigns does not delete the leader key it does not hold."""
        first, second = make_election("coord-a"), make_election("coord-b")
        assert first.acquire(timeout=5.0)
        second.start()
        second.resign()
        kv = sync_client.get(keys.leader)
        assert kv is not None and kv.lease_id == first.lease_id
        assert first.is_leader

    def test_wait_for_leadership_times_out_on_a_standby(self, leader: Election, make_election: MakeElection) -> None:
        """A standby's wait_for_leadership returns False once its timeout passes."""
        standby = make_election("coord-b")
        standby.start()
        assert standby.wait_for_leadership(timeout=0.3) is False

    def test_standby_refuses_with_not_leader_naming_the_leader(
        self, leader: Election, make_election: MakeElection
    ) -> None:
        """require_epoch on a standby raises NotLeader carrying the leader's id and address."""
        standby = make_election("coord-b")
        standby.start()
        assert wait_until(lambda: standby.observe() is not None, 2.0)
        with pytest.raises(NotLeader, match="coord-a") as info:
            standby.require_epoch()
        assert info.value.leader_id == "coord-a"
        assert info.value.leader_address == "coord-a.test:7070"


class TestLeaseLoss:
    """Losing the lease: early local step-down, on_lost, and takeover by a standby."""

    def test_stalled_refresh_steps_down_before_etcd_expiry(
        self, make_election: MakeElection, client_factory: Callable[[], EtcdClient], keys: Keys
    ) -> None:
        """A leader whose refreshes stall calls on_lost while etcd still holds its key, then a standby leads."""
        observer = client_factory()
        stall, resume = threading.Event(), threading.Event()
        seen_at_loss: list[object] = []
        lost = threading.Event()

        def refresh_hook() -> None:
            if stall.is_set():
                resume.wait(10.0)

        def on_lost(reason: str) -> None:
            seen_at_loss.append(observer.get(keys.leader))
            lost.set()

        ttl = 2.0
        first = make_election("coord-a", ttl_s=ttl, on_lost=on_lost, refresh_hook=refresh_hook)
        assert first.acquire(timeout=5.0)
        lease_id = first.lease_id
        second = make_election("coord-b", ttl_s=ttl)
        second.start()
        try:
            with capture_logs() as logs:
                stall.set()
                assert lost.wait(30.0)
                assert not first.is_leader
                assert second.wait_for_leadership(timeout=30.0)
        finally:
            resume.set()
        held = seen_at_loss[0]  # etcd still held our key when on_lost ran: we stepped down first
        assert held is not None and held.lease_id == lease_id  # type: ignore[attr-defined]
        lost_logs = [entry for entry in logs if entry["event"] == "leadership_lost"]
        assert [entry["leader_id"] for entry in lost_logs] == ["coord-a"]
        assert lost_logs[0]["lease_id"] == lease_id and "not refreshed" in lost_logs[0]["reason"]

    def test_revoked_lease_is_noticed_and_standby_takes_over(
        self, make_election: MakeElection, client_factory: Callable[[], EtcdClient]
    ) -> None:
        """When etcd drops the leader's lease the leader calls on_lost and a standby leads."""
        reasons: list[str] = []
        ttl = 2.0
        first = make_election("coord-a", ttl_s=ttl, on_lost=reasons.append)
        assert first.acquire(timeout=5.0)
        second = make_election("coord-b", ttl_s=ttl)
        second.start()
        client_factory().revoke_lease(first.lease_id)  # type: ignore[arg-type]
        assert second.wait_for_leadership(timeout=30.0)
        assert wait_until(lambda: bool(reasons), 30.0)
        assert not first.is_leader
        assert "no longer exists" in reasons[0]

    def test_deposed_leader_campaigns_again_later(self, make_election: MakeElection) -> None:
        """A candidate that lost its lease leads again once the other candidate resigns."""
        first, second = make_election("coord-a"), make_election("coord-b")
        assert first.acquire(timeout=5.0)
        second.start()
        first.step_down("test")
        assert second.wait_for_leadership(timeout=30.0)
        second.resign()
        assert first.wait_for_leadership(timeout=30.0)
