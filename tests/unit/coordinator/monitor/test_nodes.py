"""Node registry states."""

from __future__ import annotations

from common.pb.gptrm.v1 import agent_pb2, types_pb2
from common.types import NodeState
from coordinator.monitor.nodes import NodeRegistry, Outbox
from tests.helpers.clock import FakeClock


def _inv(node_id: str = "n1") -> types_pb2.NodeInventory:
    return types_pb2.NodeInventory(node_id=node_id, gpus=[types_pb2.GpuInfo(index=0)])


class TestNodeRegistry:
    def test_ready_not_ready_lost_and_back(self) -> None:
        """READY while heartbeats arrive, NOT_READY after 3 missed, LOST after the grace, READY on reconnect."""
        clock = FakeClock(100.0)
        reg = NodeRegistry(heartbeat_interval_s=1.0, lost_grace_s=30.0, now=clock)
        entry, new = reg.connect(_inv(), outbox=object())
        assert new and entry.state == NodeState.READY
        clock.t += 3.5
        assert [(e.node_id, old) for e, old in reg.refresh()] == [("n1", NodeState.READY)]
        assert entry.state == NodeState.NOT_READY
        reg.disconnect("n1", entry.stream_id)
        clock.t += 29
        reg.refresh()
        assert entry.state == NodeState.NOT_READY
        clock.t += 1
        reg.refresh()
        assert entry.state == NodeState.LOST
        entry, new = reg.connect(_inv(), outbox=object())
        assert not new and entry.state == NodeState.READY

    def test_stale_stream_disconnect_is_ignored(self) -> None:
        """The end of an old stream does not disconnect the node's newer stream."""
        reg = NodeRegistry(1.0, 30.0, now=FakeClock(100.0))
        old, _ = reg.connect(_inv(), outbox=object())
        old_stream = old.stream_id
        reg.connect(_inv(), outbox=object())
        reg.disconnect("n1", old_stream)
        assert reg.get("n1").connected

    def test_cordon_and_drain_show_when_healthy(self) -> None:
        """Admin states show on a healthy node and clear on uncordon."""
        reg = NodeRegistry(1.0, 30.0, now=FakeClock(100.0))
        entry, _ = reg.connect(_inv(), outbox=object())
        entry.record.cordoned = True
        assert reg.rederive(entry) == NodeState.CORDONED
        entry.record.draining = True
        assert reg.rederive(entry) == NodeState.DRAINING
        entry.record.cordoned = entry.record.draining = False
        assert reg.rederive(entry) == NodeState.READY
        assert reg.counts() == {"ready": 1}


    def test_a_node_without_a_stream_is_marked_connected_and_its_state_derived(self) -> None:
        """A registry whose nodes have no agents (the simulator's) brings a node up with mark_connected: its
        state is derived as for a stream (a cordon shows, silence counts), and disconnect takes it down."""
        clock = FakeClock(100.0)
        reg = NodeRegistry(heartbeat_interval_s=1.0, lost_grace_s=30.0, now=clock)
        entry = reg.load(types_pb2.NodeRecord(inventory=_inv(), cordoned=True))
        assert entry.state == NodeState.NOT_READY and not entry.connected
        assert reg.mark_connected(entry) == NodeState.CORDONED and entry.connected
        entry.record.cordoned = False
        assert reg.rederive(entry) == NodeState.READY
        clock.t += 3.5
        reg.refresh()
        assert entry.state == NodeState.NOT_READY       # not heard from since: as a silent stream
        assert reg.mark_connected(entry) == NodeState.READY
        reg.disconnect("n1", entry.stream_id)
        assert entry.state == NodeState.NOT_READY and not entry.connected


class TestPowerStates:
    def test_off_node_is_never_lost_nor_schedulable(self) -> None:
        """A node the adaptor powered off stays not-ready past the grace, counts as off, and takes no work."""
        clock = [0.0]
        reg = NodeRegistry(1.0, 5.0, now=lambda: clock[0])
        entry, _ = reg.connect(types_pb2.NodeInventory(node_id="n1"), outbox=None)
        entry.record.power_state = types_pb2.NODE_POWER_STATE_OFF
        reg.disconnect("n1", entry.stream_id)
        clock[0] = 60.0
        reg.refresh()
        assert entry.state == NodeState.NOT_READY and reg.counts() == {"off": 1}
        reg.connect(types_pb2.NodeInventory(node_id="n1"), outbox=None)
        assert entry.state == NodeState.READY and not reg.schedulable(entry)
        entry.record.power_state = types_pb2.NODE_POWER_STATE_READY
        assert reg.schedulable(entry)


class TestOutbox:
    def test_a_full_outbox_ends_its_stream_instead_of_growing(self) -> None:
        """Past its limit an outbox queues the end of the stream once and drops what follows; the end
        itself always goes in."""
        outbox = Outbox(limit=3)
        for i in range(10):
            outbox.put_nowait(agent_pb2.CoordinatorMessage(event_ack=agent_pb2.EventAck(up_to_seq=i)))
        assert outbox.overflowed and outbox.qsize() == 4
        got = [outbox.get_nowait() for _ in range(4)]
        assert [m.event_ack.up_to_seq for m in got[:3]] == [0, 1, 2] and got[3] is None
        outbox.put_nowait(None)   # a stream ended elsewhere (a newer stream of the node) still ends
        assert outbox.get_nowait() is None



class TestHealthHolds:
    def test_health_drain_reads_draining_and_a_pending_check_is_unschedulable(self) -> None:
        """A health drain is DRAINING like an admin's; a pending health check keeps a READY node unschedulable until
        its agent's next stream reports otherwise."""
        reg = NodeRegistry(1.0, 30.0, now=FakeClock(100.0))
        entry, _ = reg.connect(_inv(), outbox=object())
        entry.health_pending = True
        assert entry.state == NodeState.READY and not reg.schedulable(entry)
        entry, _ = reg.connect(_inv(), outbox=object())
        assert not entry.health_pending and reg.schedulable(entry)
        entry.record.health_drained = True
        assert reg.rederive(entry) == NodeState.DRAINING and not reg.schedulable(entry)

    def test_an_agent_with_a_health_check_takes_no_work_before_its_first_verdict(self) -> None:
        """An agent that says it runs a health check is held from its registration, before any telemetry: a task
        submitted right after it registered is not placed there ahead of the check's verdict."""
        reg = NodeRegistry(1.0, 30.0, now=FakeClock(100.0))
        inv = _inv()
        inv.health_check = True
        entry, _ = reg.connect(inv, outbox=object())
        assert entry.health_pending and not reg.schedulable(entry)
