"""The agent outbox: bounded telemetry, never-dropped status events."""

from __future__ import annotations

from structlog.testing import capture_logs

from agent.outbox import Outbox
from common.pb.gptrm.v1 import agent_pb2, types_pb2


def _sample(t: float) -> types_pb2.TelemetrySample:
    return types_pb2.TelemetrySample(time_unix_s=t)


class TestOutbox:
    def test_telemetry_drops_oldest_and_counts(self) -> None:
        """Beyond the bound the oldest samples go, and each drop is counted."""
        box = Outbox(3)
        for t in range(5):
            box.add_sample(_sample(t))
        assert [s.time_unix_s for s in box.take_samples(10)] == [2, 3, 4]
        assert box.dropped_total == 2

    def test_the_first_drop_since_samples_were_sent_is_logged(self) -> None:
        """Drops while samples cannot be sent are logged once (``telemetry_dropped``), again after a send."""
        box = Outbox(1)
        with capture_logs() as logs:
            for t in range(3):
                box.add_sample(_sample(t))
            box.take_samples(10)
            box.add_sample(_sample(3))
            box.add_sample(_sample(4))
        assert [e["dropped_total"] for e in logs if e["event"] == "telemetry_dropped"] == [1, 3]

    def test_requeue_keeps_order(self) -> None:
        """Samples that failed to send go back ahead of newer ones."""
        box = Outbox(10)
        for t in range(3):
            box.add_sample(_sample(t))
        batch = box.take_samples(2)
        box.add_sample(_sample(9))
        box.requeue_samples(batch)
        assert [s.time_unix_s for s in box.take_samples(10)] == [0, 1, 2, 9]

    def test_events_survive_until_acked(self) -> None:
        """Status events stay (whatever their number) until acknowledged, and resend oldest first."""
        box = Outbox(1)
        seqs = [box.add_event(agent_pb2.TaskStatus(task_id=f"t{i}")) for i in range(1000)]
        assert seqs == list(range(1, 1001))
        box.ack(400)
        pending = box.events_after(0)
        assert len(pending) == 600 and pending[0].task_id == "t400"
        assert [e.event_seq for e in box.events_after(999)] == [1000]
