"""Who a browser is: the same principals and roles as the Admin API (:mod:`coordinator.api.auth`).

- ``--insecure`` without ``--admin-tokens`` (the open mode): every browser is the ``anonymous`` admin, as
  every gRPC caller is (:attr:`Authenticator.open`).
- A client certificate (where the coordinator uses mutual TLS, the console serves HTTPS and asks for one):
  the principal it names, checked as the gRPC server checks it (CA, revocation, role).
- A token: posted once to the sign-in form; the browser then holds a session cookie (a random id, HttpOnly,
  SameSite=Strict, Secure under TLS; the token itself never leaves the server and never appears in a URL).
  The session keeps the token server-side and looks it up again on every request, so a token removed from
  ``--admin-tokens`` (SIGHUP) ends its sessions at once. Sessions end after :data:`IDLE_S` unused or
  :data:`MAX_AGE_S` in all, and on sign-out.

Only a person's roles (admin, queue-admin, submitter, viewer) may look: a node certificate may not. Every
sign-in, accepted or refused, leaves an audit record (method ``WebSignIn``), which the audit log also
publishes as an event; an address with too many refusals in a minute is refused without a try.
"""

from __future__ import annotations

import collections
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from coordinator.api.audit import AuditLog
from coordinator.api.auth import ROLES, Authenticator, AuthRefused, Principal

__all__ = ["COOKIE", "IDLE_S", "MAX_AGE_S", "MAX_REFUSALS", "MAX_SESSIONS", "Sessions", "SignInRefused"]

COOKIE = "gptrm_session"
IDLE_S = 8 * 3600.0
MAX_AGE_S = 24 * 3600.0
MAX_SESSIONS = 10_000
"""Sessions kept at most; the least recently used one is ended to make room."""
SIGN_IN_METHOD = "WebSignIn"
MAX_REFUSALS = 10
REFUSAL_WINDOW_S = 60.0
"""An address with :data:`MAX_REFUSALS` sign-ins refused in this many seconds is refused without a try."""


class SignInRefused(Exception):
    """A sign-in (or a certificate) the console refuses; the message says why, for the person."""


@dataclass(slots=True)
class _Session:
    token: str
    created: float
    used: float


class Sessions:
    """The console's sign-ins.

    :param authn: the coordinator's authenticator (its token table, TLS and CRL).
    :param audit: the coordinator's audit log.
    :param now: the clock (monotonic seconds).
    """

    def __init__(self, authn: Authenticator, audit: AuditLog, now: Callable[[], float] = time.monotonic) -> None:
        self.authn = authn
        self.audit = audit
        self._now = now
        self._sessions: dict[str, _Session] = {}
        self._refusals: dict[str, collections.deque[float]] = {}

    @property
    def open(self) -> bool:
        """No sign-in at all (the open mode: ``--insecure`` without tokens)."""
        return self.authn.open

    def sign_in(self, token: str, peer: str) -> tuple[str, Principal]:
        """A new session for ``token``; returns its id (the cookie's value) and its principal. Audited.

        :raises SignInRefused: the token is unknown, or names no person's role, or ``peer`` had
            :data:`MAX_REFUSALS` sign-ins refused in the last :data:`REFUSAL_WINDOW_S` (then it is not even
            tried, nor audited again: a guesser cannot flood the audit log)."""
        now = self._now()
        recent = self._refusals.get(peer)
        while recent and now - recent[0] > REFUSAL_WINDOW_S:
            recent.popleft()
        if recent is not None and len(recent) >= MAX_REFUSALS:
            raise SignInRefused("Too many refused sign-ins from this address: wait a minute.")
        who = self.authn.tokens.lookup(token) if self.authn.tokens is not None and token else None
        if who is None or who.role not in ROLES:
            reason = "token not recognised" if who is None else f"role {who.role} may not use the console"
            self.audit.record(principal=who.name if who else "", role=who.role if who else "", method=SIGN_IN_METHOD,
                              target=peer, outcome="refused", reason=reason)
            if len(self._refusals) >= MAX_SESSIONS and peer not in self._refusals:
                self._refusals.clear()
            self._refusals.setdefault(peer, collections.deque()).append(now)
            raise SignInRefused("That token is not recognised." if who is None else reason)
        self._expire(now)
        if len(self._sessions) >= MAX_SESSIONS:
            del self._sessions[min(self._sessions, key=lambda k: self._sessions[k].used)]
        sid = secrets.token_urlsafe(32)
        self._sessions[sid] = _Session(token, now, now)
        self.audit.record(principal=who.name, role=who.role, method=SIGN_IN_METHOD, target=peer, outcome="ok")
        return sid, Principal(who.name, who.role, "token", who.queues)

    def sign_out(self, sid: str) -> None:
        self._sessions.pop(sid, None)

    def principal(self, sid: str | None, cert_pem: bytes | None) -> Principal | None:
        """Who this request is: the open mode's anonymous admin; the session's token holder; else the client
        certificate's principal; None when neither (the browser must sign in).

        :raises SignInRefused: the certificate is refused (revoked, no valid principal, a node's)."""
        if self.open:
            return Principal("anonymous", "admin", "none")
        if sid:
            session = self._sessions.get(sid)
            now = self._now()
            if session is not None and (now - session.used > IDLE_S or now - session.created > MAX_AGE_S):
                del self._sessions[sid]
                session = None
            if session is not None:
                who = self.authn.tokens.lookup(session.token) if self.authn.tokens is not None else None
                if who is not None and who.role in ROLES:
                    session.used = now
                    return Principal(who.name, who.role, "token", who.queues)
                del self._sessions[sid]   # the token was removed or changed role: the session ends
        if cert_pem is not None:
            try:
                cert = self.authn.certificate({"x509_pem_cert": [cert_pem]})
            except AuthRefused as e:
                raise SignInRefused(str(e)) from None
            if cert is not None:
                if cert.role not in ROLES:
                    raise SignInRefused(f"certificate {cert.name!r} has role {cert.role}; the console is for people")
                return cert
        return None

    def _expire(self, now: float) -> None:
        for sid in [k for k, s in self._sessions.items() if now - s.used > IDLE_S or now - s.created > MAX_AGE_S]:
            del self._sessions[sid]

    def __len__(self) -> int:
        return len(self._sessions)
