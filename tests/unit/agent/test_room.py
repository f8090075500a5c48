"""The room for tasks an agent reports (agent/room.py): its task uids and free rendezvous ports."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.room import Room, ports_bound
from agent.task_user import NoRoom, TaskUserPolicy, UidClaims
from common.pb.gptrm.v1 import types_pb2
from tests.unit.agent.test_task_user import _lookup

_HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"


def _policy(uids: range) -> TaskUserPolicy:
    return TaskUserPolicy.from_config("gptrm-task", [], euid=0, getpwnam=_lookup(("gptrm-task", 990)), uids=uids)


class TestUidRoom:
    def test_free_uids_and_those_of_its_own_tasks(self, tmp_path: Path) -> None:
        """Room counts the free uids and those its own tasks hold, not another agent's live claims; once it is
        0, a start is refused as NoRoom (placed again by the coordinator, not failed)."""
        uids = range(2100000400, 2100000403)
        p = _policy(uids)
        p.claims = UidClaims(tmp_path, "agent-a")
        assert p.room([]) == 3
        mine = p.resolve("")
        assert p.room([mine.uid]) == 3
        assert UidClaims(tmp_path, "agent-b").claim(uids[2], running=())
        assert p.room([mine.uid]) == 2
        p.resolve("", taken=[mine.uid])
        with pytest.raises(NoRoom, match="no free task uid"):
            p.resolve("", taken=[mine.uid, uids[1]])

    def test_no_range_no_limit(self) -> None:
        """An agent that hands out no uids of its own reports none (the field stays absent)."""
        p = TaskUserPolicy.from_config("gptrm-task", [], euid=0, getpwnam=_lookup(("gptrm-task", 990)), uids=None)
        assert p.room([]) is None
        sample = types_pb2.TelemetrySample()
        Room(None, list, (30000, 30009)).fill(sample)
        assert not sample.HasField("task_uid_room") and sample.HasField("task_ports_free")


class TestPorts:
    def test_listening_and_connected_ports_of_the_range_count_time_wait_does_not(self, tmp_path: Path) -> None:
        """Ports in the kernel's tables: a listener (0A) and a connection (01) hold theirs; TIME_WAIT (06) does not;
        ports outside the range are ignored."""
        tcp = tmp_path / "tcp"
        tcp.write_text(_HEADER
                       + "   0: 00000000:7530 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0 0 1\n"
                       + "   1: 0100007F:7531 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0 0 2\n"
                       + "   2: 0100007F:7532 0100007F:9C41 06 00000000:00000000 00:00000000 00000000     0 0 3\n"
                       + "   3: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0 0 4\n")
        assert ports_bound(30000, 30009, [tcp, tmp_path / "missing"]) == {30000, 30001}

    def test_fill_recounts_at_most_every_interval(self) -> None:
        """The counts are taken again only once the interval has passed."""
        now = [0.0]
        own: list[int] = []
        counted: list[int] = []

        def own_uids() -> list[int]:
            counted.append(1)
            return own

        room = Room(_policy(range(2100000500, 2100000502)), own_uids, (30000, 30009), interval_s=2.0,
                    clock=lambda: now[0])
        sample = types_pb2.TelemetrySample()
        room.fill(sample)
        room.fill(sample)
        now[0] = 2.5
        room.fill(sample)
        assert len(counted) == 2 and sample.task_uid_room == 2 and 0 <= sample.task_ports_free <= 10
