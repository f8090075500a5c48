"""gptrmctl's human output helpers: escaping, truncation, causes first, units."""

from __future__ import annotations

import pytest

from coordinator.ctl.human import (
    REASON_WIDTH,
    demand_text,
    escape,
    fmt_duration,
    lead_with_cause,
    reserved_text,
    table,
    task_action_text,
    truncate,
    truncate_words,
)
from coordinator.queues import Demand, Held, Queue, QueueConfig, QueueUse, admit

GIB = 1 << 30


class TestEscape:
    def test_control_characters(self) -> None:
        """ESC, BEL and C1 controls are written as \\xNN; plain text is untouched."""
        assert escape("a\x1b[31mb\x07\x9b") == "a\\x1b[31mb\\x07\\x9b"
        assert escape("naïve 名前") == "naïve 名前"
        assert escape("rtl\u202eevil\u2066x\u2028") == "rtl\\u202eevil\\u2066x\\u2028"

    def test_newlines_kept_only_when_asked(self) -> None:
        """Log tails keep their lines; table cells do not."""
        assert escape("a\nb") == "a\\x0ab"
        assert escape("a\nb\tc", keep_newlines=True) == "a\nb\tc"


class TestLeadWithCause:
    @pytest.mark.parametrize(("reason", "expected"), [
        ("no node with 1 GPU under threshold 0.9 (1 nodes: cpu_cores over threshold)",
         "1 nodes: cpu_cores over threshold — no node with 1 GPU under threshold 0.9"),
        ("no node with X (task t1 (the first), needing no more, was refused)",
         "task t1 (the first), needing no more, was refused — no node with X"),
        ("node lost", "node lost"),
        ("(only a cause)", "(only a cause)"),
    ])
    def test_cause_first(self, reason: str, expected: str) -> None:
        """The trailing parenthesised cause moves to the front; reasons without one are unchanged."""
        assert lead_with_cause(reason) == expected


class TestQueueReasons:
    CONFIG = QueueConfig(queues=(Queue("default", members=("*",)), Queue("vision", gpus={"*": 4}, lend={"*": 0})))

    def _refused(self, demand: Demand, capacity: dict[str, int]) -> str:
        decision = admit(self.CONFIG, {"default": QueueUse(gpus={"H100": Held(0, 4)})}, capacity, demand)
        assert not decision.admit
        return decision.reason

    def test_a_queue_reason_is_whole_sentences_kept_in_order(self) -> None:
        """A waiting task's queue reason reads as sentences, starts with its subject, and is shown as built
        (no cause rotated to the front, no ``[*]`` pool tag)."""
        reason = self._refused(Demand("default", "H100", 2), {"H100": 4})
        assert reason == ("Queue default would hold 6 GPUs with this task, more than its quota of 0, so the task "
                          "needs 2 borrowed; only 0 can be borrowed now (0 lent by other queues plus 0 under no "
                          "queue's quota, minus 4 already borrowed).")
        assert lead_with_cause(reason) == reason and "[" not in reason

    def test_a_long_reason_is_cut_after_a_whole_word(self) -> None:
        """The task table's cell ends on a whole word and marks the cut."""
        reason = self._refused(Demand("default", "H100", 2), {"H100": 4})
        cell = truncate_words(reason, REASON_WIDTH)
        assert len(cell) <= REASON_WIDTH and cell.endswith("…")
        assert reason.startswith(cell[:-1]) and reason[len(cell) - 1] == " "
        assert truncate_words("x" * 100, 10) == "x" * 9 + "…"          # one long word: cut where it must be
        assert truncate_words("short", 10) == "short"


class TestCells:
    def test_truncate_cuts_the_tail(self) -> None:
        """Truncation keeps the start and marks the cut."""
        assert truncate("cpu_cores over threshold — no node", 10) == "cpu_cores…"
        assert truncate("short", 10) == "short"

    def test_table_aligns_and_escapes(self) -> None:
        """Columns line up, numbers right-aligned, and cells are escaped."""
        out = table(["A", "N"], [["x\x1b", 5], ["long", 12]], right=(1,)).splitlines()
        assert out == ["A       N", "x\\x1b   5", "long   12"]

    @pytest.mark.parametrize(("demand", "text"), [
        ({"gpus": 1, "gpu_mem_bytes": 10 * GIB, "cpu_cores": 1, "mem_bytes": 0, "disk_bytes": 0},
         "1 GPU × 10.0 GiB, 1 core, 0 B memory"),
        ({"gpus": 0.25, "gpu_mem_bytes": 0, "cpu_cores": 2, "mem_bytes": 16 * GIB, "disk_bytes": 10 * GIB},
         "0.25 GPUs, 2 cores, 16.0 GiB memory, 10.0 GiB disk"),
    ])
    def test_demand_text(self, demand: dict, text: str) -> None:
        """A demand reads as units, not a dict."""
        assert demand_text(demand) == text

    def test_durations(self) -> None:
        """Ages use the largest whole unit."""
        assert [fmt_duration(s) for s in (5, 90, 7200, 3 * 86400)] == ["5s", "2m", "2h", "3d"]


class TestStatusTelemetryRate:
    def _status(self, every: float) -> str:
        from common.pb.gptrm.v1 import admin_pb2
        from coordinator.ctl import render
        from coordinator.ctl.human import status_text

        return status_text(render.status_dict(admin_pb2.ClusterStatus(telemetry_rate=admin_pb2.TelemetryRateStatus(
            report_interval_s=every, sampling_interval_s=1, ingest_budget_per_s=3000, ingest_per_s=2990.4,
            reporting_nodes=30000))))

    def test_summaries_show_their_interval(self) -> None:
        """`gptrmctl status` says how often agents report, how many, and the ingest against its budget."""
        assert ("telemetry     every 10 s (summaries of 1 s samples), 30000 nodes reporting; ingest 2,990/s "
                "(budget 3,000/s)") in self._status(10)

    def test_every_sample(self) -> None:
        assert "telemetry     every sample (1 s)" in self._status(1)


class TestNodeReserved:
    def test_gpu_memory_is_the_node_total(self) -> None:
        """A node's reservation holds the GPU memory of all its reserved GPUs: 5 GPUs and one task's 10 GiB read
        as 10 GiB in all, not "5 GPUs × 10.0 GiB"."""
        r = {"gpus": 5.0, "gpu_mem_bytes": 10 * GIB, "cpu_cores": 1.0, "mem_bytes": 0, "disk_bytes": 0}
        assert reserved_text(r) == "5 GPUs (10.0 GiB GPU memory in all), 1 core, 0 B memory"
        assert reserved_text({**r, "gpu_mem_bytes": 0}) == "5 GPUs, 1 core, 0 B memory"


class TestTaskActions:
    @pytest.mark.parametrize(("verb", "state", "text"), [
        ("cancelled", "cancelled", "task t-1 cancelled"),
        ("cancelled", "running", "cancelling task t-1 (was running): its agents are stopping it"),
        ("paused", "running", "pausing task t-1 (was running): its agents are suspending its processes"),
        ("resumed", "running", "task t-1 resumed"),
        ("resumed", "paused", "resuming task t-1 (was paused): its agents are continuing its processes"),
    ])
    def test_says_what_happened(self, verb: str, state: str, text: str) -> None:
        """cancel, pause and resume say what was done, or what is under way and the state it was in."""
        assert task_action_text(verb, {"task_id": "t-1", "state": state}) == text
