"""Multi-endpoint client against real etcd: unreachable etcd fails fast; a 3-member cluster survives a member loss."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from common.errors import ConfigError, EtcdUnavailable
from common.pb.gptrm.v1 import types_pb2
from common.types import TaskState
from coordinator.etcd_embedded import EtcdCluster
from coordinator.sync import Election, Keys, Store, connect
from tests.helpers.ports import free_port
from tests.integration.harness import wait_until


class TestConnect:
    """connect(): reachability is checked at once, bounded by the timeout."""

    def test_unreachable_etcd_fails_fast_with_one_line(self) -> None:
        """No etcd behind the endpoints: EtcdUnavailable names them, and why each one failed, in one line."""
        endpoints = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
        with pytest.raises(EtcdUnavailable, match=rf"^etcd not reachable at {endpoints[0]},{endpoints[1]}: ") as info:
            connect(endpoints, timeout_s=1.0)
        reasons = str(info.value).split(": ", 1)[1]
        assert reasons.startswith(f"{endpoints[0]}: ") and f"; {endpoints[1]}: " in reasons   # each one tried once
        assert "\n" not in str(info.value)

    def test_bad_endpoint_is_a_config_error(self) -> None:
        """A malformed or empty endpoint list is a ConfigError naming the value."""
        with pytest.raises(ConfigError, match="'nohost:port'"):
            connect(["nohost:port"], timeout_s=1.0)
        with pytest.raises(ConfigError, match="empty"):
            connect([], timeout_s=1.0)

    def test_dead_first_endpoint_is_skipped(self, etcd_server: EtcdCluster) -> None:
        """With the first endpoint dead, connect settles on a live one."""
        dead = f"127.0.0.1:{free_port()}"
        client = connect([dead, *etcd_server.endpoints], timeout_s=2.0)
        try:
            assert client.current_endpoint == etcd_server.endpoints[0]
            assert client.get("/gptrm-test/nothing-here") is None
        finally:
            client.close()


@pytest.mark.slow
class TestClusterFailover:
    """A 3-member etcd cluster with one member killed: election and store keep working."""

    def test_store_survives_losing_the_current_member(self, etcd_cluster3: EtcdCluster, etcd_prefix: str) -> None:
        """Killing the member the client talks to: the client fails over and the leader keeps writing."""
        client = connect(etcd_cluster3.endpoints, timeout_s=3.0)
        keys = Keys(etcd_prefix)
        refreshes: list[int] = []   # one entry as each lease refresh is sent (the previous one has finished)
        election = Election(client, keys, "coord-a", "a:7070", ttl_s=3.0, refresh_hook=lambda: refreshes.append(1))
        try:
            assert election.acquire(timeout=10.0)
            store = Store(client, keys, election)
            task = store.create_task(types_pb2.Task(spec=types_pb2.TaskSpec(name="survivor")), request_id="r-1")
            killed = client.current_endpoint
            with capture_logs() as logs:
                sent_before = len(refreshes)
                etcd_cluster3.kill_member(etcd_cluster3.endpoints.index(killed))
                cancelled = store.transition(task.id, task.revision, TaskState.CANCELLED, "after member loss")
                assert store.get_task(task.id) == cancelled
                assert client.current_endpoint != killed

                def refreshed() -> int:
                    """Refreshes sent after the kill that etcd accepted (a later one has been sent since)."""
                    finished = len(refreshes) - sent_before - 1
                    return finished - sum(e["event"] == "lease_refresh_failed" for e in logs)

                # several lease refreshes through the surviving members
                wait_until(lambda: refreshed() >= 3, timeout_s=30, what="3 lease refreshes after the member loss")
            assert election.is_leader
            retry = types_pb2.Task(spec=types_pb2.TaskSpec(name="survivor"))
            assert store.create_task(retry, request_id="r-1").id == task.id
        finally:
            election.resign()
            client.close()
