"""Node providers (coordinator/adaptor/providers.py): static recommendations and operator commands run for real."""

from __future__ import annotations

import asyncio
import json
import stat
from pathlib import Path

import pytest

from common.errors import ConfigError
from coordinator.adaptor.providers import CommandProvider, StaticProvider, build_provider
from coordinator.events import EventBus
from tests.helpers.clock import FakeClock


def script(tmp: Path, body: str) -> str:
    """An executable shell script with ``body``."""
    path = tmp / "provider.sh"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)




class TestCommandProvider:
    def test_accepted_request_gets_the_json_on_stdin(self, tmp_path: Path) -> None:
        """Exit 0 is accepted, and the command received one JSON object with action, node, reason and demand."""
        seen = tmp_path / "seen.json"
        provider = CommandProvider(script(tmp_path, f"cat > {seen}\necho '{{\"ok\": true}}'\n"), EventBus())
        result = asyncio.run(provider.request("power_on", "n2", "task t-1 fits only there", {"gpus": 4.0}))
        assert result.ok
        assert json.loads(seen.read_text()) == {"action": "power_on", "node_id": "n2",
                                                "reason": "task t-1 fits only there", "demand": {"gpus": 4.0}}

    @pytest.mark.parametrize(("body", "reason"), [
        ("cat >/dev/null; echo broken >&2; exit 1\n", "exit status 1: broken"),
        ("cat >/dev/null; echo 'not json at all'\n", "output is not JSON"),
        ("cat >/dev/null; echo '[1, 2]'\n", "not an object"),
        ("cat >/dev/null; sleep 30\n", "no answer within 0.5s"),
    ])
    def test_failures_are_events_and_back_off(self, tmp_path: Path, body: str, reason: str) -> None:
        """A non-zero exit, garbage output or a hang fails with an event, and the retry waits out a doubling backoff."""
        events, clock = EventBus(), FakeClock(100.0)
        provider = CommandProvider(script(tmp_path, body), events, timeout_s=0.5, backoff_s=10, now=clock)
        result = asyncio.run(provider.request("power_off", "n1", "idle"))
        assert not result.ok and result.attempted and reason in result.reason
        [event] = events.recent(10)
        assert event.kind == "power" and event.node_id == "n1" and reason in event.fields["reason"]
        again = asyncio.run(provider.request("power_off", "n1", "idle"))
        assert not again.attempted and len(events.recent(10)) == 1
        assert provider.retry_at("power_off", "n1") == 110.0
        clock.t = 110.0
        assert asyncio.run(provider.request("power_off", "n1", "idle")).attempted
        assert provider.retry_at("power_off", "n1") == 130.0   # second failure: twice the wait

    def test_success_clears_the_backoff(self, tmp_path: Path) -> None:
        """After a failure, an accepted retry leaves nothing backing off."""
        flag = tmp_path / "fail"
        flag.touch()
        clock = FakeClock(100.0)
        provider = CommandProvider(script(tmp_path, f"cat >/dev/null; test ! -e {flag}\n"), EventBus(),
                                   backoff_s=1, now=clock)
        assert not asyncio.run(provider.request("power_on", "n1", "wake")).ok
        flag.unlink()
        clock.t += 1
        assert asyncio.run(provider.request("power_on", "n1", "wake")).ok
        assert provider.retry_at("power_on", "n1") is None

    def test_missing_executable_is_a_failure_not_a_crash(self, tmp_path: Path) -> None:
        """A command that cannot be started fails the request and says why."""
        provider = CommandProvider(str(tmp_path / "nope"), EventBus())
        result = asyncio.run(provider.request("power_off", "n1", "idle"))
        assert not result.ok and "cannot run" in result.reason


class TestStaticProvider:
    def test_create_is_a_recommendation_naming_missing_resources(self) -> None:
        """create publishes a scale-out event with the demand and sets the missing-resource gauge; power is refused."""
        events, gauge = EventBus(), {}
        provider = StaticProvider(events, gauge.__setitem__)
        assert asyncio.run(provider.request("create", "", "task t-1 fits nowhere", {"gpus": 8.0})).ok
        [event] = events.recent(5)
        assert event.kind == "scale_out" and "gpus=8" in event.message and event.fields["missing_gpus"] == "8.0"
        assert gauge == {"gpus": 8.0}
        off = asyncio.run(provider.request("power_off", "n1", "idle"))
        assert not off.ok and not off.attempted and not provider.can_power


class TestBuild:
    def test_command_needs_a_path(self) -> None:
        """--node-provider command without --node-provider-command is a configuration error naming the flag."""
        with pytest.raises(ConfigError, match="--node-provider-command"):
            build_provider("command", "", EventBus(), timeout_s=1)
        assert build_provider("static", "", EventBus(), timeout_s=1).name == "static"
