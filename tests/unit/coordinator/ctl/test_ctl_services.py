"""gptrmctl's service flags: --replicas MIN:MAX and --target-util into spec.service, and their usage errors."""

from __future__ import annotations

import pytest

from coordinator.ctl.main import build_parser
from coordinator.ctl.spec import service_from_args, spec_from_args
from coordinator.ctl.transport import EXIT_USAGE, CtlError


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

    @pytest.mark.parametrize("argv", [("--replicas", "1:x"), ("--replicas", "-1:2"), ("--target-util", "0.5")])
    def test_malformed_service_flags_are_usage_errors(self, argv: tuple[str, ...]) -> None:
        """A malformed range, a negative bound, or a target without --replicas exits 2 naming the flag."""
        with pytest.raises(CtlError) as e:
            _parse(*argv, "--", "serve")
        assert e.value.code == EXIT_USAGE and argv[0] in str(e.value)
