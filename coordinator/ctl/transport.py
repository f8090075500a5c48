"""gptrmctl's connection to the coordinator: try each address, follow the leader, ride out a leader change.

Exit codes (README, "gptrmctl"): 1 refused request, 2 usage error, 3 no coordinator answers, 70 an internal
error of gptrmctl itself (a bug; one line on stderr, the traceback with ``--debug``).

While a leader changes, nobody may answer, a redirect may lead to a standby (the dead leader's
address, restarted), or every replica may still name the old leader. None of that is a refusal:
the request is tried again, with exponential backoff, until its deadline (``timeout_s``); a
write is re-sent unchanged, so a submit keeps its request id and creates one task. Only when the
deadline passes does gptrmctl give up with exit code 3.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import grpc

from common.errors import ConfigError
from common.pb.gptrm.v1 import admin_pb2_grpc
from common.tls import ClientTls, tls_files
from coordinator.rpc_metadata import LEADER_METADATA_KEY, NOT_LEADER_METADATA_KEY, REFUSED_METADATA_KEY

__all__ = ["EXIT_INTERNAL", "EXIT_NO_COORDINATOR", "EXIT_REFUSED", "EXIT_USAGE", "ChannelSecurity", "CtlError",
           "Transport"]

EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_NO_COORDINATOR = 3
EXIT_INTERNAL = 70
"""gptrmctl itself failed (EX_SOFTWARE): not a refusal, not bad input."""

T = TypeVar("T")


class CtlError(Exception):
    """A failure gptrmctl reports in one line and exits with ``code``."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def _metadata(err: grpc.RpcError, key: str) -> str:
    # At run time each item is a (key, value) pair, text values for the text keys read here; the grpc stubs
    # type the items as objects with key and value attributes.
    metadata: tuple[tuple[str, str], ...] = err.trailing_metadata() or ()  # type: ignore[assignment]
    for k, value in metadata:
        if k == key:
            return value
    return ""


def _leader_hint(err: grpc.RpcError) -> str:
    return _metadata(err, LEADER_METADATA_KEY)


@dataclass(frozen=True)
class ChannelSecurity:
    """How gptrmctl reaches the coordinator: TLS credentials (or explicit plaintext) and a bearer token."""

    credentials: grpc.ChannelCredentials | None
    token: str = ""

    @classmethod
    def from_settings(cls, *, insecure: bool, cert: str, key: str, ca: str, token: str = "") -> ChannelSecurity:
        """:raises ConfigError: incomplete TLS settings without ``insecure``, or unreadable files."""
        files = tls_files(insecure=insecure, cert=cert, key=key, ca=ca)
        if token and any(c.isspace() or not c.isprintable() for c in token):
            raise ConfigError("token: contains whitespace or control characters")
        return cls(ClientTls(files).credentials() if files is not None else None, token)

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()


class _Retry(Exception):
    """One pass over the addresses found no leader to answer; worth trying again until the deadline."""


class Transport:
    """Calls Admin RPCs on the first coordinator that answers; writes follow the leader.

    :param addresses: ``HOST:PORT`` candidates, tried in order.
    :param timeout_s: deadline of one request, retries during a leader change included.
    :param security: builds the channel security at the first call (default: plaintext, no token).
    :param clock: monotonic clock (injected in tests).
    :param sleep: how to wait between passes (injected in tests).
    """

    BACKOFF_INITIAL_S = 0.1
    BACKOFF_MAX_S = 2.0

    def __init__(self, addresses: Sequence[str], timeout_s: float = 10.0,
                 security: Callable[[], ChannelSecurity] | None = None, *,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
        self.addresses = [a for a in addresses if a]
        self.timeout_s = timeout_s
        self._clock, self._sleep = clock, sleep
        self._channels: dict[str, grpc.Channel] = {}
        self.passes = 0   # passes over the addresses made by the last call (1 without a leader change)
        self._security_factory = security or (lambda: ChannelSecurity(None))
        self._security: ChannelSecurity | None = None

    @property
    def security(self) -> ChannelSecurity:
        if self._security is None:
            self._security = self._security_factory()
        return self._security

    def stub(self, address: str) -> admin_pb2_grpc.AdminStub:
        if address not in self._channels:
            creds = self.security.credentials
            self._channels[address] = (grpc.secure_channel(address, creds) if creds is not None
                                       else grpc.insecure_channel(address))
        return admin_pb2_grpc.AdminStub(self._channels[address])

    def call(self, method: str, request: Any, *, write: bool = False) -> Any:
        """Unary call; redirects to the leader are followed, and a leader change is waited out."""
        md = self.security.metadata
        deadline = self._clock() + self.timeout_s
        return self._retrying(lambda stub: getattr(stub, method)(
            request, timeout=max(0.2, deadline - self._clock()), metadata=md), write=write, deadline=deadline)

    def stream(self, method: str, request: Any, *, leader_only: bool = False) -> Any:
        """Server-streaming (or, given an iterable of requests, bidirectional) call without a deadline
        (``events --follow``); ``leader_only`` follows a standby's redirect to the leader as writes do
        (``logs``, ``exec``: only the leader has the agents)."""
        md = self.security.metadata
        # A bidirectional call's requests (an iterable, not a message) are iterated afresh by each try.
        fresh = (lambda: iter(request)) if hasattr(request, "__iter__") else (lambda: request)
        return self._retrying(lambda stub: getattr(stub, method)(fresh(), metadata=md), write=leader_only,
                              streaming=True, deadline=self._clock() + self.timeout_s)

    def _retrying(self, fn: Callable[[admin_pb2_grpc.AdminStub], T], *, write: bool, deadline: float,
                  streaming: bool = False) -> T:
        delay = self.BACKOFF_INITIAL_S
        self.passes = 0
        while True:
            self.passes += 1
            try:
                return self._try_all(fn, write=write, streaming=streaming)
            except _Retry as e:
                if self._clock() + delay >= deadline:
                    raise CtlError(str(e), EXIT_NO_COORDINATOR) from None
                self._sleep(delay)
                delay = min(self.BACKOFF_MAX_S, delay * 2)

    def _try_all(self, fn: Callable[[admin_pb2_grpc.AdminStub], T], *, write: bool, streaming: bool = False) -> T:
        tried: list[str] = []
        refusal = ""
        etcd_down = ""
        last_reason = ""
        not_leader = ""
        queue = list(self.addresses)
        while queue:
            address = queue.pop(0)
            if address in tried:
                continue
            tried.append(address)
            try:
                result = fn(self.stub(address))
                if streaming:
                    # stream() is the one streaming caller, and its T is Any: the wrapped call is what it returns.
                    return cast(T, _PeekedStream(result))
                return result
            except grpc.RpcError as err:
                code = err.code()
                hint = _leader_hint(err)
                if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    marker = _metadata(err, REFUSED_METADATA_KEY)
                    if marker == "etcd-unavailable":
                        etcd_down = err.details() or code.name
                    elif marker:
                        refusal = err.details() or code.name
                    last_reason = (err.details() or code.name).splitlines()[0]
                    if hint and hint not in tried:
                        queue.insert(0, hint)
                    continue
                if code == grpc.StatusCode.FAILED_PRECONDITION and _metadata(err, NOT_LEADER_METADATA_KEY):
                    # A standby (or a leader that just lost its lease): follow its hint, else try the others.
                    not_leader = err.details() or code.name
                    if hint and hint not in tried:
                        queue.insert(0, hint)
                    continue
                if write and code == grpc.StatusCode.FAILED_PRECONDITION and hint and hint not in tried:
                    queue.insert(0, hint)
                    continue
                details = err.details() or code.name
                if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                    details = f"{code.name}: {details}"
                raise CtlError(details, EXIT_REFUSED) from None
        if refusal:
            raise CtlError(refusal, EXIT_REFUSED)
        if etcd_down:
            # etcd unreachable from the coordinators: no write can be stored now, but nothing was
            # refused for what it asked: wait it out like a leader change (exit 3 at the deadline).
            raise _Retry(etcd_down)
        if not_leader:
            raise _Retry(f"no leader answered ({not_leader})")
        hint = " (with mutual TLS, check --tls-cert/--tls-key/--tls-ca; plaintext needs --insecure on both sides)" \
            if self.security.credentials is not None or "Socket closed" in last_reason else ""
        raise _Retry(f"no coordinator answered at {', '.join(tried) or '(none given)'}"
                     + (f": {last_reason}" if last_reason else "") + hint)

    def close(self) -> None:
        for ch in self._channels.values():
            ch.close()


class _PeekedStream:
    """A server stream whose first message was read, so connection errors surface in ``_try_all``."""

    def __init__(self, call: Any) -> None:
        self._call = call
        self._first: list[Any] = []
        with contextlib.suppress(StopIteration):
            self._first.append(next(call))

    def __iter__(self) -> Any:
        yield from self._first
        yield from self._call

    def cancel(self) -> None:
        self._call.cancel()
