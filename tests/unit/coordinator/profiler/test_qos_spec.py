"""The QoS fields of a task spec: parsed from YAML and gptrmctl flags, refused at submit naming the field."""

from __future__ import annotations

import math
import signal
from datetime import UTC, datetime
from typing import Any

import pytest

from common.errors import ValidationError
from common.pb.gptrm.v1 import types_pb2
from coordinator.ctl.main import build_parser
from coordinator.ctl.spec import spec_from_args
from coordinator.ctl.transport import CtlError
from coordinator.profiler.profiler import spec_data, spec_from_mapping, spec_to_proto, validate_spec
from coordinator.profiler.qos_spec import metrics_url_of, parse_deadline, parse_duration, parse_signal

NOW = 1_750_000_000.0
VALID = {"name": "serve", "kind": "inference", "model": {"name": "llama", "params_billions": 7}, "argv": ["serve"]}


def spec(**fields: Any) -> types_pb2.TaskSpec:
    return spec_from_mapping({**VALID, **fields}, now=lambda: NOW)


def refused(**fields: Any) -> str:
    """The field named by the refusal of VALID plus ``fields``."""
    with pytest.raises(ValidationError) as info:
        validate_spec(spec(**fields), max_gpus_per_node=8, now=NOW)
    return info.value.field


class TestValidateQosSpec:
    """Bad QoS input is refused at submit with the field named."""

    def test_valid_qos_fields_pass(self) -> None:
        """A spec using every QoS field validates."""
        validate_spec(spec(priority=10, preemptible=False, checkpoint_signal="usr2", metrics_port=8000,
                           metrics_mapping={"flavour": "tgi", "ttft_histogram": "tgi:ttft_seconds"},
                           qos={"deadline": "2h30m", "max_latency_ms": 500, "min_tokens_per_s": 100}),
                      max_gpus_per_node=8, now=NOW)
        validate_spec(spec(metrics_url="http://[::1]:9000/stats?format=prom"), max_gpus_per_node=8, now=NOW)

    @pytest.mark.parametrize(("fields", "field"), [
        ({"priority": -1}, "spec.priority"),
        ({"checkpoint_signal": "SIGFOO"}, "spec.checkpoint_signal"),
        ({"checkpoint_signal": "KILL"}, "spec.checkpoint_signal"),
        ({"checkpoint_signal": "sigstop"}, "spec.checkpoint_signal"),
        ({"qos": {"deadline_unix_s": NOW - 1}}, "spec.qos.deadline_unix_s"),
        ({"qos": {"deadline_unix_s": NOW}}, "spec.qos.deadline_unix_s"),
        ({"qos": {"deadline_unix_s": NOW + 20 * 365 * 86400}}, "spec.qos.deadline_unix_s"),
        ({"qos": {"deadline_unix_s": math.nan}}, "spec.qos.deadline_unix_s"),
        ({"qos": {"max_latency_ms": -5}}, "spec.qos.max_latency_ms"),
        ({"qos": {"min_tokens_per_s": math.inf}}, "spec.qos.min_tokens_per_s"),
        ({"metrics_port": 65536}, "spec.metrics_port"),
        ({"metrics_url": "https://127.0.0.1:8000/metrics"}, "spec.metrics_url"),
        ({"metrics_url": "http://10.0.0.5:8000/metrics"}, "spec.metrics_url"),
        ({"metrics_url": "http://example.com/metrics"}, "spec.metrics_url"),
        ({"metrics_url": "http://user:pw@127.0.0.1:8000/metrics"}, "spec.metrics_url"),
        ({"metrics_url": "http://127.0.0.1:99999/metrics"}, "spec.metrics_url"),
        ({"metrics_url": "http://127.0.0.1:8000/" + "x" * 600}, "spec.metrics_url"),
        ({"metrics_url": "http://127.0.0.1:8000/metrics", "metrics_port": 8000}, "spec.metrics_url"),
        ({"metrics_mapping": {"flavour": "vllm"}}, "spec.metrics_mapping"),
        ({"metrics_port": 8000, "metrics_mapping": {"flavour": "triton"}}, "spec.metrics_mapping.flavour"),
        ({"metrics_port": 8000, "metrics_mapping": {"latency_histogram": "bad name"}},
         "spec.metrics_mapping.latency_histogram"),
        ({"metrics_port": 8000, "metrics_mapping": {"waiting_gauge": "q" * 300}}, "spec.metrics_mapping.waiting_gauge"),
        ({"metrics_port": 8000, "metrics_mapping": {"flavour": "custom"}}, "spec.metrics_mapping"),
    ])
    def test_refused(self, fields: dict[str, Any], field: str) -> None:
        """Negative priority, bad signals, past or absurd deadlines, bad ports/URLs/mappings name their field."""
        assert refused(**fields) == field

    def test_shape_errors_name_the_field(self) -> None:
        """A negative port, a NaN priority and an unknown mapping role are refused while parsing."""
        for fields, field in (({"metrics_port": -1}, "spec.metrics_port"), ({"priority": math.nan}, "spec.priority"),
                              ({"preemptible": "no"}, "spec.preemptible"),
                              ({"metrics_mapping": {"latency": "x"}}, "spec.metrics_mapping.latency")):
            with pytest.raises(ValidationError) as info:
                spec(**fields)
            assert info.value.field == field


class TestSpecFields:
    """Defaults and the plain form."""

    def test_preemptible_defaults_to_true(self) -> None:
        """Absent preemptible means preemptible; false is kept through the plain form and back."""
        assert spec_data(spec()).preemptible is True
        data = spec_data(spec(preemptible=False, checkpoint_signal="SIGUSR2"))
        assert (data.preemptible, data.checkpoint_signal) == (False, "SIGUSR2")
        back = spec_to_proto(data)
        assert back.HasField("preemptible") and not back.preemptible and back.checkpoint_signal == "SIGUSR2"
        assert not spec_to_proto(spec_data(spec())).HasField("preemptible")

    def test_metrics_url_of(self) -> None:
        """A port stands for /metrics on 127.0.0.1; a URL is used as given; neither is ""."""
        assert metrics_url_of(spec(metrics_port=8000)) == "http://127.0.0.1:8000/metrics"
        assert metrics_url_of(spec(metrics_url="http://localhost:9/m")) == "http://localhost:9/m"
        assert metrics_url_of(spec()) == ""

    def test_yaml_deadline_forms(self) -> None:
        """qos.deadline takes a duration from now, an ISO time or unix seconds, never with deadline_unix_s."""
        assert spec(qos={"deadline": "2h30m"}).qos.deadline_unix_s == NOW + 9000
        iso = "2030-01-02T03:04:05Z"
        assert spec(qos={"deadline": iso}).qos.deadline_unix_s == datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC).timestamp()
        assert spec(qos={"deadline": NOW + 5}).qos.deadline_unix_s == NOW + 5
        for bad in ({"deadline": "soon"}, {"deadline": "1h", "deadline_unix_s": NOW + 60}, {"deadline": True}):
            with pytest.raises(ValidationError) as info:
                spec(qos=bad)
            assert info.value.field == "spec.qos.deadline"


class TestParsers:
    """Signal names, durations and deadlines."""

    @pytest.mark.parametrize(("name", "expected"), [("SIGUSR1", signal.SIGUSR1), ("usr2", signal.SIGUSR2),
                                                    (" sigint ", signal.SIGINT), ("TERM", signal.SIGTERM)])
    def test_signal_names(self, name: str, expected: signal.Signals) -> None:
        """With or without SIG, any case."""
        assert parse_signal(name) is expected

    @pytest.mark.parametrize("name", ["", "USR3", "SIGKILL", "STOP", "9"])
    def test_bad_signals(self, name: str) -> None:
        """Unknown names and uncatchable signals are refused."""
        with pytest.raises(ValueError):
            parse_signal(name)

    @pytest.mark.parametrize(("text", "seconds"), [("90s", 90), ("2h30m", 9000), ("1d", 86400), ("500ms", 0.5),
                                                   ("1.5h", 5400), ("1h1m1s", 3661)])
    def test_durations(self, text: str, seconds: float) -> None:
        """NUMBER+UNIT parts add up."""
        assert parse_duration(text) == seconds

    @pytest.mark.parametrize("text", ["", "90", "h", "2h 30m", "-1h", "1w"])
    def test_bad_durations(self, text: str) -> None:
        """Bare numbers, missing numbers, spaces, signs and unknown units are refused."""
        with pytest.raises(ValueError):
            parse_duration(text)

    def test_deadline_without_offset_is_local_time(self) -> None:
        """An ISO time without an offset is read as local time."""
        assert parse_deadline("2030-01-02T03:04:05", NOW) == datetime(2030, 1, 2, 3, 4, 5).timestamp()


def submit_args(*argv: str) -> types_pb2.TaskSpec:
    args = build_parser().parse_args(["submit", *argv])
    return spec_from_args(args)


class TestSubmitFlags:
    """gptrmctl submit flags land in the spec's QoS fields."""

    def test_all_flags(self) -> None:
        """--no-preemptible, --checkpoint-signal, --deadline, targets and the metrics flags."""
        s = submit_args("--gpus", "1", "--priority", "5", "--no-preemptible", "--checkpoint-signal", "USR2",
                        "--deadline", "1h", "--max-latency-ms", "800", "--min-tokens-per-s", "50",
                        "--metrics-port", "8000", "--metrics-flavour", "custom",
                        "--metrics-name", "latency_histogram=my_latency_seconds", "--", "serve")
        assert s.HasField("preemptible") and not s.preemptible and s.checkpoint_signal == "USR2"
        assert s.qos.deadline_unix_s > 0 and s.qos.max_latency_ms == 800 and s.qos.min_tokens_per_s == 50
        assert s.metrics_port == 8000 and s.metrics_mapping.flavour == "custom"
        assert s.metrics_mapping.latency_histogram == "my_latency_seconds" and s.priority == 5

    def test_defaults_leave_fields_unset(self) -> None:
        """Without QoS flags the spec is preemptible (field absent) and has no endpoint or deadline."""
        s = submit_args("--gpus", "1", "--", "serve")
        assert not s.HasField("preemptible") and not s.HasField("metrics_mapping") and not s.HasField("qos")
        assert s.metrics_port == 0 and s.metrics_url == ""

    @pytest.mark.parametrize(("argv", "needle"), [
        (("--deadline", "whenever"), "spec.qos.deadline"),
        (("--metrics-name", "latency_histogram"), "--metrics-name"),
        (("--metrics-name", "p99=x"), "spec.metrics_mapping.p99"),
        (("--metrics-port", "-3"), "spec.metrics_port"),
    ])
    def test_bad_flags_are_usage_errors(self, argv: tuple[str, ...], needle: str) -> None:
        """Unparsable QoS flags are usage errors (exit 2) naming the flag or field."""
        with pytest.raises(CtlError) as info:
            submit_args("--gpus", "1", *argv, "--", "serve")
        assert info.value.code == 2 and needle in str(info.value)
