"""Leader take-over that fails gives the lease up instead of holding it without leading."""

from __future__ import annotations

import asyncio
import threading

from common.pb.gptrm.v1 import types_pb2
from coordinator.events import EventBus
from coordinator.sync import EtcdClient, Keys
from coordinator.sync.leadership import Leadership


class _Exploding:
    """A leader role whose take-over raises an unexpected error."""

    def __init__(self) -> None:
        self.calls = threading.Event()

    async def take_over(self, record: types_pb2.LeaderRecord) -> bool:
        self.calls.set()
        raise RuntimeError("boom while loading")

    def start_leading(self) -> None:
        raise AssertionError("must not start leading after a failed take-over")

    def stand_down(self, reason: str) -> None:
        pass


class TestTakeOverFailure:
    def test_unexpected_error_resigns_the_lease(self, sync_client: EtcdClient, keys: Keys) -> None:
        """An exception inside take-over is caught: the replica does not lead and the leader key is released."""
        async def scenario() -> None:
            leadership = Leadership(sync_client, keys, "c-zombie", "127.0.0.1:1", ttl_s=2.0, events=EventBus())
            role = _Exploding()
            leadership.start(role, asyncio.get_running_loop())
            try:
                for _ in range(200):
                    if role.calls.is_set():
                        break
                    await asyncio.sleep(0.05)
                assert role.calls.is_set()
                for _ in range(100):
                    if not leadership.election.is_leader:
                        break
                    await asyncio.sleep(0.02)
                assert not leadership.leading and not leadership.election.is_leader
                held = sync_client.get(keys.leader)
                assert held is None   # the lease was revoked, not left to a zombie
            finally:
                await leadership.resign()
        asyncio.run(scenario())
