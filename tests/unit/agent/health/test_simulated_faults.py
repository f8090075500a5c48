"""Faults injected into simulated GPUs (``--simulate-faults FILE``): the file, its lines, the readings."""

from __future__ import annotations

from pathlib import Path

import pytest
import structlog

from agent.collectors.simulated import SimulatedGpus
from agent.health import FaultFile, HealthOptions, XidPolicy, parse_fault
from agent.health.faults import MAX_LINE_BYTES
from common.errors import ValidationError
from common.pb.gptrm.v1 import types_pb2
from tests.helpers.clock import FakeClock


def gpus_with(path: Path, clock: FakeClock, *, policy: XidPolicy | None = None) -> SimulatedGpus:
    return SimulatedGpus("4xH100-80GB", "n1", clock=clock, jitter=0.0, now=clock,
                         health=HealthOptions(policy or XidPolicy(), simulate_faults=str(path)))


def append(path: Path, *lines: str) -> None:
    with path.open("a") as f:
        for line in lines:
            f.write(line + "\n")


class TestParse:
    """One line of the file."""

    @pytest.mark.parametrize(("line", "field"), [
        ('{"gpu": 9, "xid": 79}', "gpu"),
        ('{"gpu": "1", "xid": 79}', "gpu"),
        ('{"xid": 79}', "gpu"),
        ('{"gpu": 1, "xid": 0}', "xid"),
        ('{"gpu": 1, "xid": true}', "xid"),
        ('{"gpu": 1, "throttle": "hot"}', "throttle"),
        ('{"gpu": 1, "row_remap": "maybe"}', "row_remap"),
        ('{"gpu": 1, "lost": 1}', "lost"),
        ('{"gpu": 1, "nvlink_down": 99}', "nvlink_down"),
        ('{"gpu": 1, "melt": true}', "melt"),
        ('{"gpu": 1}', "line"),
        ("[1, 2]", "line"),
        ("{not json", "line"),
    ])
    def test_bad_line_names_the_field(self, line: str, field: str) -> None:
        with pytest.raises(ValidationError) as info:
            parse_fault(line, 4)
        assert info.value.field == field

    def test_good_line(self) -> None:
        assert parse_fault('{"gpu": 1, "throttle": null, "xid": 13}', 4) == {"gpu": 1, "throttle": None, "xid": 13}


class TestSimulatedGpusTakeFaults:
    """The simulated backend applies the file's lines and classifies them like real signals."""

    def test_xid_79_makes_the_gpu_unhealthy_replace(self, tmp_path: Path, clock: FakeClock) -> None:
        """XID 79: unhealthy (replace), ``healthy=False`` with the reason for older readers, labelled simulated."""
        path = tmp_path / "faults.jsonl"
        gpus = gpus_with(path, clock)
        assert all(r.health is not None and r.health.state == "healthy" for r in gpus.collect())
        append(path, '{"gpu": 3, "xid": 79}')
        gpu = gpus.collect()[3].to_proto()
        assert (gpu.healthy, gpu.health_reason, gpu.xid_last) == (False, "xid 79 (simulated)", 79)
        assert gpu.health.state == types_pb2.GPU_HEALTH_STATE_UNHEALTHY
        assert gpu.health.action == types_pb2.GPU_HEALTH_ACTION_REPLACE
        assert (gpu.health.reason, gpu.health.evidence, gpu.health.simulated) == ("xid 79", "xid=79 (simulated)", True)
        assert gpu.health.since_unix_s == clock.t
        append(path, '{"gpu": 3, "reset": true}')
        assert not gpus.collect()[3].healthy   # a replace-kind fault outlives a reset

    def test_application_xid_is_counted_gpu_stays_healthy(self, tmp_path: Path, clock: FakeClock) -> None:
        path = tmp_path / "faults.jsonl"
        append(path, '{"gpu": 0, "xid": 13}')
        gpus = gpus_with(path, clock)
        gpu = gpus.collect()[0].to_proto()
        assert gpu.healthy and gpu.health.state == types_pb2.GPU_HEALTH_STATE_HEALTHY
        assert (gpu.health.app_xid_count, gpu.health.app_xid_last, gpu.health.app_xid_unix_s) == (1, 13, clock.t)
        assert gpus.collect()[0].to_proto().health.app_xid_count == 1   # counted once, carried on

    def test_throttle_degrades_then_clears(self, tmp_path: Path, clock: FakeClock) -> None:
        path = tmp_path / "faults.jsonl"
        gpus = gpus_with(path, clock)
        for value, reason in (('"thermal"', "thermal slowdown"), ('"hardware"', "hardware slowdown"),
                              ('"power_brake"', "power brake")):
            append(path, f'{{"gpu": 1, "throttle": {value}}}')
            r = gpus.collect()[1]
            assert r.healthy and r.health is not None and (r.health.state, r.health.reason) == ("degraded", reason)
        append(path, '{"gpu": 1, "throttle": null}')
        assert gpus.collect()[1].health.state == "healthy"   # type: ignore[union-attr]

    def test_throttled_clocks_drop(self, tmp_path: Path, clock: FakeClock) -> None:
        """A busy GPU that is throttled runs its SM clock lower than its busy neighbour."""
        path = tmp_path / "faults.jsonl"
        gpus = gpus_with(path, clock)
        gpus.place("t", [0, 1], util_per_gpu=1.0, mem_bytes_per_gpu=0)
        append(path, '{"gpu": 1, "throttle": "power_brake"}')
        first, second = gpus.collect()[:2]
        assert second.sm_clock_mhz is not None and first.sm_clock_mhz is not None
        assert second.sm_clock_mhz < first.sm_clock_mhz

    def test_reset_kind_faults_clear_after_a_reset(self, tmp_path: Path, clock: FakeClock) -> None:
        """Double-bit ECC, a pending remap, an XID 48 and a downed NVLink all clear with a simulated reset."""
        path = tmp_path / "faults.jsonl"
        gpus = gpus_with(path, clock)
        append(path, '{"gpu": 2, "ecc_dbe": 1}')
        r = gpus.collect()[2]
        assert r.health is not None and (r.health.state, r.health.action, r.health.evidence) == (
            "unhealthy", "reset", "ecc_uncorrected_volatile=1 (simulated)")
        assert r.ecc_uncorrected_total == 1
        append(path, '{"gpu": 2, "row_remap": "pending", "xid": 48, "nvlink_down": 2}')
        assert gpus.collect()[2].health.action == "reset"   # type: ignore[union-attr]
        append(path, '{"gpu": 2, "reset": true}')
        r = gpus.collect()[2]
        assert r.healthy and r.health is not None and r.health.state == "healthy"

    def test_nvlink_down_and_pcie_narrower_degrade(self, tmp_path: Path, clock: FakeClock) -> None:
        path = tmp_path / "faults.jsonl"
        gpus = gpus_with(path, clock)
        append(path, '{"gpu": 0, "nvlink_down": 2}', '{"gpu": 1, "pcie_width": 8}')
        readings = gpus.collect()
        assert readings[0].health.evidence == "nvlink 2 down (simulated)"   # type: ignore[union-attr]
        assert readings[1].health.evidence == "pcie_width=8 max=16 (simulated)"   # type: ignore[union-attr]

    def test_row_remap_failure_and_lost(self, tmp_path: Path, clock: FakeClock) -> None:
        path = tmp_path / "faults.jsonl"
        gpus = gpus_with(path, clock)
        append(path, '{"gpu": 2, "row_remap": "failed"}', '{"gpu": 3, "lost": true}')
        readings = gpus.collect()
        assert readings[2].health.reason == "row remap failure"   # type: ignore[union-attr]
        assert readings[3].health.reason == "gpu lost" and readings[3].util_gpu is None   # type: ignore[union-attr]

    def test_bad_line_is_logged_and_skipped(self, tmp_path: Path, clock: FakeClock) -> None:
        """A bad line is logged naming its line number and field; the lines around it still apply."""
        path = tmp_path / "faults.jsonl"
        gpus = gpus_with(path, clock)
        append(path, '{"gpu": 0, "xid": 13}', '{"gpu": 7, "xid": 79}', "x" * (MAX_LINE_BYTES + 10),
               '{"gpu": 1, "xid": 79}')
        with structlog.testing.capture_logs() as logs:
            readings = gpus.collect()
        skipped = [(e["line"], e["field"]) for e in logs if e["event"] == "simulated_fault_skipped"]
        assert skipped == [(2, "gpu"), (3, "line")]
        assert readings[0].health.app_xid_count == 1 and not readings[1].healthy   # type: ignore[union-attr]

    def test_lines_split_across_writes_and_long_ones(self, tmp_path: Path, clock: FakeClock) -> None:
        """A line is applied once its newline is written; a line too long is skipped even when written in parts."""
        path = tmp_path / "faults.jsonl"
        faults = FaultFile(path, structlog.get_logger())
        assert faults.read(4) == []   # no file yet
        path.write_text('{"gpu": 0, ')
        assert faults.read(4) == []
        with path.open("a") as f:
            f.write('"xid": 13}\n' + "y" * (MAX_LINE_BYTES + 1))
        assert faults.read(4) == [{"gpu": 0, "xid": 13}]
        with path.open("a") as f:
            f.write('more"}\n{"gpu": 1, "xid": 31}\n')
        assert faults.read(4) == [{"gpu": 1, "xid": 31}]

    def test_a_replaced_file_is_read_from_its_start(self, tmp_path: Path) -> None:
        path = tmp_path / "faults.jsonl"
        faults = FaultFile(path, structlog.get_logger())
        append(path, '{"gpu": 0, "xid": 13}', '{"gpu": 0, "xid": 13}')
        assert len(faults.read(4)) == 2
        path.write_text('{"gpu": 1, "xid": 79}\n')
        assert faults.read(4) == [{"gpu": 1, "xid": 79}]

    def test_inject_and_set_healthy(self, clock: FakeClock) -> None:
        """Tests inject faults directly; ``set_healthy(i, True)`` starts a GPU's health over."""
        gpus = SimulatedGpus("2xL4-24GB", "n1", clock=clock)
        gpus.inject({"gpu": 1, "xid": 79})
        assert not gpus.collect()[1].healthy
        gpus.set_healthy(1, True)
        assert gpus.collect()[1].healthy
        with pytest.raises(ValidationError):
            gpus.inject({"gpu": 5, "xid": 79})
