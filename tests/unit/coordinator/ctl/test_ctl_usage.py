"""gptrmctl usage: times, the JSON document and its schema, CSV and the table."""

from __future__ import annotations

import argparse
import csv
import io

import pytest

from common.errors import UsageError
from common.pb.gptrm.v1 import admin_pb2
from coordinator.ctl.main import main
from coordinator.ctl.usage import CSV_COLUMNS, parse_time, usage_csv, usage_dict, usage_request, usage_table
from tests.helpers.ctl_schema import validate

NOW = 1_800_000_000.0


def report() -> admin_pb2.UsageReport:
    return admin_pb2.UsageReport(
        since_unix_s=NOW - 7 * 86400, until_unix_s=NOW + 3600, by="queue", accounted_until_unix_s=NOW,
        price_gpu_hour={"H100": 2.5}, price_kwh=0.2,
        rows=[admin_pb2.UsageReportRow(key="default", gpu_hours_by_model={"NVIDIA H100": 2.0, "A100": 1.0},
                                       gpu_hours=3.0, cpu_core_hours=12.0, energy_kwh=1.5, cost=5.3, tasks=4),
              admin_pb2.UsageReportRow(key="=cmd|x", gpu_hours_by_model={"A100": 0.5}, gpu_hours=0.5, tasks=1)])


class TestTimes:
    @pytest.mark.parametrize(("text", "expected"), [
        ("now", NOW), ("7d", NOW - 7 * 86400), ("24h", NOW - 86400), ("90m", NOW - 5400), ("2w", NOW - 14 * 86400),
        ("1.5h", NOW - 5400), ("2026-11-01", 1793491200.0), ("2026-11-01T08:30", 1793491200.0 + 8.5 * 3600),
        ("2026-11-01T08:30+01:00", 1793491200.0 + 7.5 * 3600),
    ])
    def test_accepted(self, text: str, expected: float) -> None:
        assert parse_time(text, NOW, "--since") == expected

    @pytest.mark.parametrize("text", ["yesterday", "7x", "", "-3d", "2026-13-01"])
    def test_refused_naming_the_flag(self, text: str) -> None:
        with pytest.raises(UsageError, match="--since"):
            parse_time(text, NOW, "--since")

    def test_request_and_empty_period(self) -> None:
        args = argparse.Namespace(since="2d", until="1d", by="user")
        assert usage_request(args, lambda: NOW) == admin_pb2.UsageRequest(
            since_unix_s=NOW - 2 * 86400, until_unix_s=NOW - 86400, by="user")
        with pytest.raises(UsageError, match="not before"):
            usage_request(argparse.Namespace(since="1d", until="2d", by="queue"), lambda: NOW)


class TestDocuments:
    def test_json_validates_and_totals(self) -> None:
        d = usage_dict(report())
        validate(d, "usage")
        validate(usage_dict(admin_pb2.UsageReport(by="model")), "usage")
        assert d["total"] == {"gpu_hours": 3.5, "gpu_hours_by_model": {"A100": 1.5, "NVIDIA H100": 2.0},
                              "cpu_core_hours": 12.0, "energy_kwh": 1.5, "cost": 5.3, "tasks": 5}
        assert d["prices"] == {"gpu_hour": {"H100": 2.5}, "kwh": 0.2}
        assert list(d["rows"][0]["gpu_hours_by_model"]) == ["A100", "NVIDIA H100"]

    def test_schema_refuses_other_shapes(self) -> None:
        import jsonschema

        d = usage_dict(report())
        d["rows"][0]["gpu_hours"] = "3"
        with pytest.raises(jsonschema.ValidationError):
            validate(d, "usage")

    def test_csv_has_a_header_and_defuses_formulas(self) -> None:
        rows = list(csv.reader(io.StringIO(usage_csv(usage_dict(report())))))
        assert tuple(rows[0]) == CSV_COLUMNS and len(rows) == 3
        assert rows[1][:6] == ["default", "3", "12", "1.5", "5.3", "4"]
        assert rows[1][6] == "A100=1;NVIDIA H100=2"
        assert rows[2][0] == "'=cmd|x"

    def test_table(self) -> None:
        text = usage_table(usage_dict(report()))
        lines = text.splitlines()
        assert lines[0] == ("usage 2027-01-08 08:00 UTC → 2027-01-15 09:00 UTC by queue (accounted until 2027-01-15 "
                            "08:00 UTC)")
        assert lines[1].split()[:2] == ["QUEUE", "GPU-HOURS"]
        assert lines[-1].split()[:2] == ["TOTAL", "3.50"]

    def test_csv_only_for_usage(self, capsys: pytest.CaptureFixture[str]) -> None:
        assert main(["-o", "csv", "status"]) == 2
        assert "only usage writes CSV" in capsys.readouterr().err
