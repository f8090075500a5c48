"""Web console sign-ins: the Admin API's tokens and roles, sessions that end with their token, audit."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from coordinator.api.audit import AuditLog
from coordinator.api.auth import Authenticator
from coordinator.events import EventBus
from coordinator.tokens import TokenFile, new_token, token_line
from coordinator.web.console import local_host_name
from coordinator.web.sessions import IDLE_S, MAX_REFUSALS, REFUSAL_WINDOW_S, Sessions, SignInRefused


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Sessions, dict[str, str], Path, Path, EventBus, Clock]:
    toks = {"vera": new_token(), "alice": new_token()}
    path = tmp_path / "tokens"
    path.write_text(token_line("vera", "viewer", toks["vera"]) + "\n"
                    + token_line("alice", "submitter", toks["alice"], queues=("a",)) + "\n")
    bus, clock = EventBus(), Clock()
    audit = tmp_path / "audit.log"
    sessions = Sessions(Authenticator(tls=False, tokens=TokenFile(str(path))), AuditLog(audit, bus), now=clock)
    return sessions, toks, path, audit, bus, clock


def test_sign_in_gives_a_session_with_the_tokens_principal_and_is_audited(setup) -> None:
    sessions, toks, _, audit, bus, _ = setup
    sid, who = sessions.sign_in(toks["alice"], "127.0.0.1")
    assert (who.name, who.role, who.queues) == ("alice", "submitter", ("a",))
    assert toks["alice"] not in sid and len(sid) >= 40
    again = sessions.principal(sid, None)
    assert again is not None and again.name == "alice"
    record = json.loads(audit.read_text().splitlines()[-1])
    assert record["method"] == "WebSignIn" and record["outcome"] == "ok" and record["principal"] == "alice"
    assert any(e.kind == "audit" and "WebSignIn" in e.message for e in bus.recent(10))


def test_unknown_token_is_refused_and_audited(setup) -> None:
    sessions, _, _, audit, _, _ = setup
    with pytest.raises(SignInRefused):
        sessions.sign_in("gptrm_not-a-token", "127.0.0.1")
    record = json.loads(audit.read_text().splitlines()[-1])
    assert record["outcome"] == "refused" and record["method"] == "WebSignIn"
    assert sessions.principal("made-up-session", None) is None and sessions.principal(None, None) is None


def test_an_address_guessing_tokens_is_held_off_for_a_minute(setup) -> None:
    """After MAX_REFUSALS refusals in a minute an address is refused without a try (and without an audit record
    each); other addresses are not; after the window it may try again."""
    sessions, toks, _, audit, _, clock = setup
    for _ in range(MAX_REFUSALS):
        with pytest.raises(SignInRefused):
            sessions.sign_in("gptrm_guess", "10.0.0.9")
    audited = len(audit.read_text().splitlines())
    with pytest.raises(SignInRefused, match="Too many"):
        sessions.sign_in(toks["vera"], "10.0.0.9")
    assert len(audit.read_text().splitlines()) == audited
    assert sessions.sign_in(toks["vera"], "10.0.0.8")[1].name == "vera"
    clock.t += REFUSAL_WINDOW_S + 1
    assert sessions.sign_in(toks["vera"], "10.0.0.9")[1].name == "vera"


def test_removed_token_ends_its_sessions(setup) -> None:
    sessions, toks, path, _, _, _ = setup
    sid, _ = sessions.sign_in(toks["vera"], "127.0.0.1")
    path.write_text(token_line("alice", "submitter", toks["alice"], queues=("a",)) + "\n")
    sessions.authn.reload()
    assert sessions.principal(sid, None) is None
    assert len(sessions) == 0


def test_idle_session_ends_and_sign_out_ends_it(setup) -> None:
    sessions, toks, _, _, _, clock = setup
    sid, _ = sessions.sign_in(toks["vera"], "127.0.0.1")
    clock.t += IDLE_S + 1
    assert sessions.principal(sid, None) is None
    sid, _ = sessions.sign_in(toks["vera"], "127.0.0.1")
    sessions.sign_out(sid)
    assert sessions.principal(sid, None) is None


def test_open_mode_is_the_anonymous_admin() -> None:
    sessions = Sessions(Authenticator(tls=False), AuditLog(None))
    who = sessions.principal(None, None)
    assert who is not None and (who.name, who.role) == ("anonymous", "admin")


def test_open_console_answers_only_requests_addressed_to_this_machine() -> None:
    """In the open mode a request must name this host (an IP address, localhost, its own name): a site whose
    name was re-pointed at the console's address (DNS rebinding) is refused."""
    for host in ("127.0.0.1:7780", "[::1]:7780", "localhost:7780", "10.0.0.5", f"{socket.gethostname()}:80",
                 "app.localhost:7780"):
        assert local_host_name(host), host
    for host in ("evil.example:7780", "evil.example", "127.0.0.1.evil.example:7780", ""):
        assert not local_host_name(host), host
