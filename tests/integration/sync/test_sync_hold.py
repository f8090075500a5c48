"""A standby holds an agent that just lost its leader until a successor is known (``Leadership.hold_after_loss``).

Real etcd, real elections: replica A leads; an agent whose session with A broke asks standby B.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from coordinator.events import EventBus
from coordinator.sync import EtcdClient, Keys
from coordinator.sync.leadership import Leadership
from tests.helpers.roles import IdleRole


async def _until(cond: Callable[[], bool], what: str, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def _scenario(sync_client: EtcdClient, keys: Keys, names: list[str],
              body: Callable[[dict[str, Leadership]], Awaitable[None]]) -> None:
    """Start replicas ``names`` in order (the first one leads), run ``body``, resign them all."""
    async def run() -> None:
        replicas: dict[str, Leadership] = {}
        try:
            for name in names:
                replicas[name] = Leadership(sync_client, keys, name, f"127.0.0.1:{1000 + len(replicas)}", ttl_s=2.0,
                                            events=EventBus())
                replicas[name].start(IdleRole(), asyncio.get_running_loop())
                if len(replicas) == 1:
                    await _until(lambda: replicas[names[0]].leading, f"{names[0]} to lead")
            # Every standby has seen the leader (its watch or campaign observed the key).
            await _until(lambda: all(r.election.observe() is not None for r in replicas.values()),
                         "every replica to observe the leader")
            await body(replicas)
        finally:
            for r in replicas.values():
                await r.resign()
    asyncio.run(run())


class TestHoldAfterLoss:
    def test_a_live_leader_gets_the_agent_back_after_the_hold(self, sync_client: EtcdClient, keys: Keys) -> None:
        """The leader is alive (only the agent's stream broke): after the hold, the redirect names it."""
        async def body(r: dict[str, Leadership]) -> None:
            a, b = r["a"], r["b"]
            started = time.monotonic()
            msg = await b.hold_after_loss(a.epoch, timeout_s=0.5)
            assert msg is not None and msg.redirect.leader_id == "a"
            assert msg.redirect.leader_address == "127.0.0.1:1000"
            assert time.monotonic() - started >= 0.5   # held, not sent straight back
        _scenario(sync_client, keys, ["a", "b"], body)

    def test_an_agent_of_another_epoch_is_not_held(self, sync_client: EtcdClient, keys: Keys) -> None:
        """An agent that lost an older leader is sent to the current one at once."""
        async def body(r: dict[str, Leadership]) -> None:
            a, b = r["a"], r["b"]
            msg = await asyncio.wait_for(b.hold_after_loss(a.epoch - 1, timeout_s=30), timeout=5)
            assert msg is not None and msg.redirect.leader_id == "a"
        _scenario(sync_client, keys, ["a", "b"], body)

    def test_an_agent_that_lost_nothing_is_sent_to_the_leader_at_once(self, sync_client: EtcdClient,
                                                                       keys: Keys) -> None:
        async def body(r: dict[str, Leadership]) -> None:
            msg = await asyncio.wait_for(r["b"].hold_after_loss(0, timeout_s=30), timeout=5)
            assert msg is not None and msg.redirect.leader_id == "a"
        _scenario(sync_client, keys, ["a", "b"], body)

    def test_the_standby_that_wins_serves_the_held_agent(self, sync_client: EtcdClient, keys: Keys) -> None:
        """The lost leader goes away while the agent is held: the standby takes over and serves it (None)."""
        async def body(r: dict[str, Leadership]) -> None:
            a, b = r["a"], r["b"]
            held = asyncio.create_task(b.hold_after_loss(a.epoch, timeout_s=30))
            await asyncio.sleep(0)
            assert not held.done()
            await a.resign()
            assert await asyncio.wait_for(held, timeout=15) is None
            assert b.leading
        _scenario(sync_client, keys, ["a", "b"], body)

    def test_a_held_agent_is_sent_to_the_successor(self, sync_client: EtcdClient, keys: Keys) -> None:
        """With two standbys, the held agent ends up with the new leader, never with the lost one."""
        async def body(r: dict[str, Leadership]) -> None:
            a, b, c = r["a"], r["b"], r["c"]
            lost = a.epoch
            held = asyncio.create_task(c.hold_after_loss(lost, timeout_s=30))
            await a.resign()
            msg = await asyncio.wait_for(held, timeout=15)
            if msg is None:
                assert c.leading
            else:
                assert msg.redirect.leader_id == "b" and msg.redirect.leader_address == "127.0.0.1:1001"
                await _until(lambda: b.leading, "b to lead")
                assert b.epoch != lost
        _scenario(sync_client, keys, ["a", "b", "c"], body)
