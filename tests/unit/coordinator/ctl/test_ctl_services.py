"""gptrmctl's service flags (--replicas MIN:MAX, --target-util) and its service document (JSON and table)."""

from __future__ import annotations

import pytest

from common.pb.gptrm.v1 import admin_pb2, types_pb2
from coordinator.ctl import human, render
from coordinator.ctl.main import build_parser
from coordinator.ctl.spec import service_from_args, spec_from_args
from coordinator.ctl.transport import EXIT_USAGE, CtlError
from tests.helpers.ctl_schema import validate


def _parse(*argv: str):
    args = build_parser().parse_args(["submit", *argv])
    spec = spec_from_args(args)
    return spec, service_from_args(args, spec)


class TestServiceFlags:
    def test_replicas_and_target_fill_the_service(self) -> None:
        """--replicas 1:4 --target-util 0.6 becomes spec.service with MIN, MAX and the target."""
        spec, is_service = _parse("--replicas", "1:4", "--target-util", "0.6", "--metrics-port", "9000", "--",
                                  "serve")
        assert is_service
        assert (spec.service.min_replicas, spec.service.max_replicas) == (1, 4)
        assert spec.service.target_util == pytest.approx(0.6) and spec.metrics_port == 9000

    def test_plain_submit_is_not_a_service(self) -> None:
        """Without --replicas the spec has no service part."""
        spec, is_service = _parse("--", "train")
        assert not is_service and not spec.HasField("service")

    def test_pack_replicas(self) -> None:
        """--pack-replicas lets the replicas share a node; without it they spread."""
        packed, _ = _parse("--replicas", "1:4", "--target-util", "0.6", "--pack-replicas", "--", "serve")
        spread, _ = _parse("--replicas", "1:4", "--target-util", "0.6", "--", "serve")
        assert packed.service.pack_replicas and not spread.service.pack_replicas

    @pytest.mark.parametrize("argv", [("--replicas", "1:x"), ("--replicas", "-1:2"), ("--target-util", "0.5"),
                                      ("--pack-replicas",)])
    def test_malformed_service_flags_are_usage_errors(self, argv: tuple[str, ...]) -> None:
        """A malformed range, a negative bound, or a target without --replicas exits 2 naming the flag."""
        with pytest.raises(CtlError) as e:
            _parse(*argv, "--", "serve")
        assert e.value.code == EXIT_USAGE and argv[0] in str(e.value)


class TestServiceDocument:
    def _view(self) -> admin_pb2.ServiceView:
        svc = types_pb2.Service(id="s-1", desired=2, pinned=False, reason="p95 latency ms 900 vs target 600: 1 → 2",
                                signal=900.0, load=float("nan"), forecast_load=12.0, forecast_replicas=2,
                                forecast_mape=float("nan"), lead_time_s=42.0, forecast_model="holt")
        svc.spec.name = "llm"
        svc.spec.qos.max_latency_ms = 600
        svc.spec.service.min_replicas, svc.spec.service.max_replicas = 1, 4
        svc.decisions.add(time_unix_s=1.0, from_replicas=1, to_replicas=2, reason="up")
        view = admin_pb2.ServiceView(service=svc)
        r = view.replicas.add(id="t-1", replica_index=1, state=types_pb2.TASK_STATE_RUNNING)
        r.allocation.nodes.add(node_id="n1")
        r.qos_reading.CopyFrom(types_pb2.TaskQos(task_id="t-1", latency_p95_s=0.45))
        return view

    def test_json_matches_the_schema_and_unknowns_are_null(self) -> None:
        """The service document validates against service.json; unknown (NaN) values are null."""
        d = render.service_dict(self._view())
        validate(d, "service")
        assert d["load"] is None and d["forecast_mape"] is None and d["signal"] == 900.0
        assert d["target"] == {"signal": "p95_latency_ms", "value": 600.0}
        assert d["replicas"][0]["node"] == "n1" and d["replicas"][0]["replica"] == 1

    def test_table_shows_count_forecast_and_replicas(self) -> None:
        """The human view names the count and range, the forecast with its model, and each replica's QoS."""
        text = human.service_detail(render.service_dict(self._view()))
        assert "2 desired (1..4, autoscaled)" in text
        assert "(holt)" in text and "MAPE last day n/a" in text
        assert "p95 450 ms" in text and "n1" in text
