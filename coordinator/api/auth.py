"""Who may call what: mutual-TLS identities, bearer tokens and roles, as a grpc.aio interceptor.

Principals and roles:

- a client certificate issued by ``gptrmctl certs`` names its holder and role (``node``,
  ``coordinator``, or a person's role below; see :mod:`coordinator.certs`);
- a bearer token (``authorization: Bearer TOKEN``) listed, hashed, in ``--admin-tokens``
  gives a person's role; a token outranks the certificate it arrives with, except that a node
  certificate can never call the Admin API.

A person's role (:data:`ROLES`, highest first):

- ``admin``: the cluster admin; every call (policy, nodes, every queue, every task). Credentials
  issued before the team roles existed were all ``admin`` and keep this meaning.
- ``queue-admin``: a team lead; what a submitter may, over its queues and every queue below them,
  and changes to the queues below its own (changing a queue needs admin over its parent).
- ``submitter``: a team member; submits to its queues and acts on their tasks and services
  (logs, pause, resume, cancel, scale).
- ``viewer``: reads; never a secret field (:mod:`coordinator.api.tenancy`).

What each call needs (:func:`required_role`): Health is open (load balancers probe it);
reflection needs any authenticated principal; ``AgentGateway`` needs a node certificate (with
TLS); Admin reads (``Get*``, ``List*``, ``Stream*``, ``Watch*``) need ``viewer``, the per-task and
per-queue calls of :data:`TEAM_METHODS` a team role (which queue they touch is the servicer's
check, :mod:`coordinator.api.tenancy`), and everything else ``admin`` (unknown methods fail
closed). A role satisfies what the roles below it need. No credentials is UNAUTHENTICATED, the
wrong role PERMISSION_DENIED, each with a message naming what is missing. Every refusal and every
call that changes something leaves one audit record (:mod:`coordinator.api.audit`); a read that
needs more than ``viewer`` (``TaskLogs``) is audited only when refused.

Without TLS and without tokens (``--insecure`` alone: ``make run``, loopback tests) nothing is
checked and callers act as ``anonymous`` admins; the coordinator logs a warning at start and
``gptrmctl status`` shows it.

Queues: a certificate or token may also name the queues its holder may submit to (the first is
its default); the principal carries them (``Principal.queues``), taken from the token when one
is presented, else from the certificate. A principal that names no queues may use any queue
(``Principal.any_queue``): the ``anonymous`` principal of the open mode, and credentials issued
without queues. :func:`queue_refusal` is the check a servicer makes; it returns a
:class:`~common.errors.PermissionDenied` to raise, which the interceptor answers with
PERMISSION_DENIED and audits as ``refused`` with its reason (as it does any handler that answers
PERMISSION_DENIED).

The servicer reads the call's principal with :func:`current_principal`: the interceptor sets it,
in a context variable, before the handler runs (every handler kind; one asyncio task per call,
so it never leaks into another call).

Example::

    security = Security.from_config(cfg, core.events)
    server = grpc.aio.server(interceptors=[security.interceptor])
    security.add_port(server, cfg.listen)
    loop.add_signal_handler(signal.SIGHUP, security.reload)
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from common.errors import ConfigError, GptrmError, PermissionDenied, ValidationError
from common.logging import get_logger
from common.tls import ServerTls, tls_files
from coordinator.api.audit import AuditLog
from coordinator.certs import QUEUE_KINDS, identity_from_pem, load_crl_serials
from coordinator.tokens import TokenFile

__all__ = ["ADMIN", "QUEUE_ADMIN", "ROLES", "SUBMITTER", "TEAM_METHODS", "VIEWER", "AuthInterceptor", "AuthRefused",
           "Authenticator", "Principal", "Security", "acting_as", "current_principal", "queue_refusal", "required_role"]

ADMIN_SERVICE = "gptrm.v1.Admin"
GATEWAY_SERVICE = "gptrm.v1.AgentGateway"
HEALTH_SERVICE = "grpc.health.v1.Health"
_READ_PREFIXES = ("Get", "List", "Stream", "Watch", "Describe")
_ADMIN_READS = frozenset({"TaskLogs"})
"""Calls that need more than ``viewer`` and change nothing: their refusals are audited, their answers
are not (a log follower would flood the audit trail and the event stream with reads)."""
_ANY = "any"
ADMIN, QUEUE_ADMIN, SUBMITTER, VIEWER = "admin", "queue-admin", "submitter", "viewer"
ROLES = QUEUE_KINDS
"""A person's roles, highest first (``admin``, ``queue-admin``, ``submitter``, ``viewer``): each may do
what the roles after it may."""
_RANK = {role: len(ROLES) - i for i, role in enumerate(ROLES)}
TEAM_METHODS = {
    "SubmitTask": SUBMITTER, "CancelTask": SUBMITTER, "PauseTask": SUBMITTER, "ResumeTask": SUBMITTER,
    "TaskLogs": SUBMITTER, "CreateService": SUBMITTER, "ScaleService": SUBMITTER, "CancelService": SUBMITTER,
    "SetQueue": QUEUE_ADMIN, "RemoveQueue": QUEUE_ADMIN, "CancelArray": SUBMITTER,
    "CancelTasks": SUBMITTER, "Session": SUBMITTER,
}
"""The Admin calls a team role may make, each confined by the servicer to the caller's queues; the
role each needs at least. TaskLogs is here, not a read: task output can hold secrets."""
_CACHE_MAX = 4096


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated caller.

    :param name: certificate CN/SAN name, token name, or ``anonymous``.
    :param role: one of :data:`ROLES`, ``node`` or ``coordinator``.
    :param via: ``certificate``, ``token`` or ``none`` (no authentication configured).
    :param queues: the queues the credential names, in its order (the first is the default);
        empty when it names none, which means any queue (:attr:`any_queue`).
    """

    name: str
    role: str
    via: str
    queues: tuple[str, ...] = ()

    @property
    def any_queue(self) -> bool:
        """Whether this principal may use any queue: its credential names none (the open mode's
        ``anonymous``, and certificates and tokens issued without queues)."""
        return not self.queues

    @property
    def cluster_admin(self) -> bool:
        """Whether this principal may do anything (role ``admin``, or the open mode's ``anonymous``)."""
        return self.role == ADMIN

    def at_least(self, role: str) -> bool:
        """Whether this principal's role is ``role`` or above it (:data:`ROLES`)."""
        return _RANK.get(self.role, 0) >= _RANK[role]

    @property
    def default_queue(self) -> str:
        """The queue a submission that names none goes to for this principal ("" when :attr:`any_queue`)."""
        return self.queues[0] if self.queues else ""


_CURRENT: contextvars.ContextVar[Principal | None] = contextvars.ContextVar("gptrm_principal", default=None)


def current_principal() -> Principal | None:
    """The principal of the call being handled, as the interceptor admitted it.

    None outside a call, in open methods (Health), and in a servicer served without the
    :class:`AuthInterceptor`.
    """
    return _CURRENT.get()


@contextlib.contextmanager
def acting_as(principal: Principal) -> Iterator[None]:
    """Run the block as ``principal`` (what :func:`current_principal` returns inside it): how a caller in
    the same process (the web console, :mod:`coordinator.web`) calls the Admin servicer's methods with the
    identity it authenticated, so their checks and redaction apply to it as to a gRPC caller."""
    token = _CURRENT.set(principal)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def queue_refusal(principal: Principal | None, queue: str) -> PermissionDenied | None:
    """The refusal to raise when ``principal`` may not submit to ``queue``, or None when it may.

    :param principal: the caller (:func:`current_principal`); None (no interceptor admitted the
        call) is refused, never taken as "any queue".
    :param queue: the queue the call asks for, after resolving the default
        (:attr:`Principal.default_queue`).
    :returns: a :class:`~common.errors.PermissionDenied` naming the queue, the caller and the
        queues it may use, e.g. ``queue 'a': 'bob' may submit to b, c``.
    """
    if principal is None:
        return PermissionDenied(f"queue {queue!r}: the call has no authenticated principal")
    if principal.any_queue or queue in principal.queues:
        return None
    return PermissionDenied(f"queue {queue!r}: {principal.name!r} may submit to {', '.join(principal.queues)}",
                            principal.name, principal.role)


class AuthRefused(GptrmError):
    """A call refused for its credentials; ``code`` is UNAUTHENTICATED or PERMISSION_DENIED."""

    def __init__(self, code: grpc.StatusCode, message: str, principal: str = "", role: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.principal = principal
        self.role = role


def required_role(method: str) -> str | None:
    """The role a full method name (``/gptrm.v1.Admin/CancelTask``) needs; None for open methods."""
    service, _, name = method.lstrip("/").partition("/")
    if service == HEALTH_SERVICE:
        return None
    if service.startswith("grpc.reflection."):
        return _ANY
    if service == GATEWAY_SERVICE:
        return "node"
    if service == ADMIN_SERVICE and name.startswith(_READ_PREFIXES):
        return VIEWER
    if service == ADMIN_SERVICE and name in TEAM_METHODS:
        return TEAM_METHODS[name]
    return ADMIN


def _roles_from(needed: str) -> str:
    """``admin, queue-admin or submitter``: the roles that satisfy ``needed``, highest first."""
    ok = ROLES[:ROLES.index(needed) + 1]
    return ok[0] if len(ok) == 1 else f"{', '.join(ok[:-1])} or {ok[-1]}"


def _bearer(metadata: Iterable[tuple[str, Any]] | None) -> str | None:
    for key, value in metadata or ():
        if key == "authorization":
            text = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
            scheme, _, token = text.partition(" ")
            return token.strip() if scheme.lower() == "bearer" else ""
    return None


class Authenticator:
    """Turns a call's TLS peer and metadata into a :class:`Principal`, or refuses it.

    :param tls: whether the server requires client certificates.
    :param tokens: the ``--admin-tokens`` table, if configured.
    :param crl: CA-signed CRL of revoked certificates (checked against ``ca_pem``).
    :param ca_pem: the CA bundle, to verify the CRL's signature.
    :raises ConfigError: the CRL is unreadable or not signed by the CA.
    """

    def __init__(self, *, tls: bool, tokens: TokenFile | None = None, crl: Path | None = None,
                 ca_pem: bytes | None = None) -> None:
        self.tls = tls
        self.tokens = tokens
        self.crl = crl
        self._ca_pem = ca_pem
        self._revoked: set[int] = set()
        self._identities: dict[bytes, Any] = {}
        self.reload()

    @property
    def open(self) -> bool:
        """No authentication at all (``--insecure`` without ``--admin-tokens``)."""
        return not self.tls and self.tokens is None

    @property
    def mode(self) -> str:
        return {(True, True): "mtls+tokens", (True, False): "mtls", (False, True): "tokens",
                (False, False): "none"}[(self.tls, self.tokens is not None)]

    def reload(self) -> None:
        """Re-read the CRL and the token file (SIGHUP).

        :raises ConfigError: the new CRL or token file is invalid (the previous ones stay).
        """
        if self.crl is not None:
            try:
                self._revoked = load_crl_serials(self.crl, self._ca_pem or b"")
            except GptrmError as e:
                raise ConfigError(f"tls_crl: {e}") from None
        if self.tokens is not None:
            self.tokens.reload()

    def certificate(self, auth_context: Mapping[str, Iterable[bytes]] | None) -> Principal | None:
        """The principal named by the peer's verified certificate (None without TLS).

        :raises AuthRefused: the certificate names no valid principal, or is revoked.
        """
        pems = list((auth_context or {}).get("x509_pem_cert") or [])
        if not self.tls or not pems:
            return None
        pem = pems[0]
        ident = self._identities.get(pem)
        if ident is None:
            try:
                ident = identity_from_pem(pem)
            except ValidationError as e:
                ident = e
            if len(self._identities) >= _CACHE_MAX:
                self._identities.clear()
            self._identities[pem] = ident
        if isinstance(ident, ValidationError):
            raise AuthRefused(grpc.StatusCode.UNAUTHENTICATED,
                              f"client certificate names no valid gptrm principal: {ident}")
        if ident.serial in self._revoked:
            raise AuthRefused(grpc.StatusCode.UNAUTHENTICATED,
                              f"client certificate {ident.name!r} (serial {ident.serial:x}) is revoked",
                              ident.name, ident.role)
        return Principal(ident.name, ident.role, "certificate", ident.queues)

    def authorize(self, method: str, metadata: Iterable[tuple[str, Any]] | None,
                  auth_context: Mapping[str, Iterable[bytes]] | None) -> Principal | None:
        """Decide one call.

        :returns: the principal (None for open methods).
        :raises AuthRefused: with the status code and a message naming what is missing.
        """
        needed = required_role(method)
        if needed is None:
            return None
        if self.open:
            return Principal("anonymous", "admin", "none")
        short = method.rsplit("/", 1)[-1]
        cert = self.certificate(auth_context)
        if needed == _ANY and cert is not None:
            return cert
        if needed == "node":
            if not self.tls:
                return Principal("anonymous", "node", "none")   # agents are authenticated by certificates only
            if cert is None or cert.role != "node":
                raise AuthRefused(grpc.StatusCode.PERMISSION_DENIED,
                                  f"{short} needs a node certificate; this one has role "
                                  f"{cert.role if cert else 'none'!r}", cert.name if cert else "",
                                  cert.role if cert else "")
            return cert
        if cert is not None and cert.role == "node":
            raise AuthRefused(grpc.StatusCode.PERMISSION_DENIED,
                              f"node certificates cannot call the Admin API ({short}; node {cert.name!r})",
                              cert.name, cert.role)
        token = _bearer(metadata)
        principal = cert
        if token is not None:
            who = self.tokens.lookup(token) if self.tokens is not None else None
            if who is None:
                raise AuthRefused(grpc.StatusCode.UNAUTHENTICATED,
                                  "bearer token is not recognised (unknown, removed, or this coordinator has no "
                                  "--admin-tokens)", cert.name if cert else "", cert.role if cert else "")
            principal = Principal(who.name, who.role, "token", who.queues)   # the token's queues, not the certificate's
        if principal is None or principal.role not in ROLES:
            raise AuthRefused(grpc.StatusCode.UNAUTHENTICATED if principal is None else
                              grpc.StatusCode.PERMISSION_DENIED,
                              f"{short} needs credentials with role {_roles_from(VIEWER if needed == _ANY else needed)}"
                              f": a client certificate with one of the roles {', '.join(ROLES)}, or a bearer token "
                              "(gptrmctl --token / GPTRM_TOKEN)" + (f"; certificate {principal.name!r} has role "
                                                                    f"{principal.role!r}" if principal else ""),
                              principal.name if principal else "", principal.role if principal else "")
        if needed != _ANY and not principal.at_least(needed):
            raise AuthRefused(grpc.StatusCode.PERMISSION_DENIED,
                              f"{short} needs role {_roles_from(needed)}; {principal.name!r} has role "
                              f"{principal.role!r}", principal.name, principal.role)
        return principal


def _target(request: Any, response: Any = None) -> str:
    """What a call acts on, for its audit record: the task, node, service, policy or queue it names
    (SetQueue's queue message), else what it created (the response's id), else the queue a submit asks for."""
    for field in ("task_id", "node_id", "service_id", "name"):
        value = getattr(request, field, None)
        if isinstance(value, str) and value:
            return value
    name = getattr(getattr(request, "queue", None), "name", None)
    if isinstance(name, str) and name:
        return name
    named = getattr(request, "filter", None)   # a bulk cancel: what its filter names
    if named is not None and hasattr(named, "users"):
        parts = [f"{k}={','.join(map(str, getattr(named, k)))}" for k in ("users", "queues", "states")
                 if getattr(named, k)]
        return " ".join(parts + ([f"name={named.name}"] if named.name else [])) or "filter (none)"
    value = getattr(response, "id", None)
    if isinstance(value, str) and value:
        return value
    asked = getattr(getattr(request, "spec", None), "queue", None)
    return f"queue {asked}" if isinstance(asked, str) and asked else ""


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Wraps every handler: admit or refuse the caller, then audit what needs auditing.

    :param authn: the :class:`Authenticator`.
    :param audit: the :class:`~coordinator.api.audit.AuditLog`.
    """

    def __init__(self, authn: Authenticator, audit: AuditLog) -> None:
        self.authn = authn
        self.audit = audit
        self._wrapped: dict[str, tuple[Any, Any]] = {}   # method → (its handler, that handler wrapped)

    async def intercept_service(self, continuation: Callable[..., Any],
                                handler_call_details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None:   # no such method: nothing kept for a name a caller made up
            return None
        known = self._wrapped.get(method)
        if known is not None and known[0] is handler:   # every call of a method gets the same wrapper
            return known[1]
        wrapped = handler
        if required_role(method) is not None:
            audited = (required_role(method) != VIEWER and method.startswith(f"/{ADMIN_SERVICE}/")
                       and method.rsplit("/", 1)[-1] not in _ADMIN_READS)
            wrapped = _wrap(handler, self, method, audited)
        self._wrapped[method] = (handler, wrapped)
        return wrapped

    async def admit(self, method: str, context: grpc.aio.ServicerContext, request: Any = None) -> Principal | None:
        """Authorize or abort the call (auditing the refusal, with the request's target when there is one)."""
        try:
            return self.authn.authorize(method, context.invocation_metadata(), context.auth_context())
        except AuthRefused as e:
            self.audit.record(principal=e.principal or f"anonymous@{context.peer()}", role=e.role,
                              method=method.rsplit("/", 1)[-1], target=_target(request), outcome="refused",
                              reason=str(e))
            await context.abort(e.code, str(e))
            raise AssertionError("unreachable") from None   # abort raises

    def finish(self, principal: Principal | None, method: str, context: grpc.aio.ServicerContext,
               request: Any, response: Any, error: BaseException | None) -> None:
        """Audit a call's outcome: ``ok``, ``refused`` (the handler refused the caller:
        :class:`~common.errors.PermissionDenied`, or an answer of PERMISSION_DENIED) or ``error``."""
        p = principal or Principal("anonymous", "", "none")
        if isinstance(error, PermissionDenied):
            outcome, reason = "refused", f"PERMISSION_DENIED: {error}"
        else:
            code = context.code() if error is not None else None
            ok = error is None or code in (None, grpc.StatusCode.OK)
            outcome = "ok" if ok else "refused" if code == grpc.StatusCode.PERMISSION_DENIED else "error"
            reason = "" if ok else f"{code.name if code else type(error).__name__}: {context.details() or error}"
        self.audit.record(principal=p.name, role=p.role, method=method.rsplit("/", 1)[-1],
                          target=_target(request, response), outcome=outcome, reason=reason)

    async def failed(self, principal: Principal | None, method: str, context: grpc.aio.ServicerContext,
                     request: Any, error: BaseException, audited: bool) -> None:
        """After the handler raised ``error``: audit it when the method is audited or an Admin
        handler refused the caller, and answer a :class:`~common.errors.PermissionDenied` with
        PERMISSION_DENIED (a handler may raise one without translating it itself). The
        AgentGateway audits its own refusals (``agent_guard``), so an answer of PERMISSION_DENIED
        there is not recorded twice."""
        if isinstance(error, PermissionDenied):
            self.finish(principal, method, context, request, None, error)
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, str(error))
        if audited or (method.startswith(f"/{ADMIN_SERVICE}/") and _code(context) == grpc.StatusCode.PERMISSION_DENIED):
            self.finish(principal, method, context, request, None, error)


def _code(context: grpc.aio.ServicerContext) -> grpc.StatusCode | None:
    try:
        return context.code()
    except Exception:   # a context that cannot say (the call already torn down): not a refusal
        return None


def _wrap(handler: Any, ic: AuthInterceptor, method: str, audited: bool) -> Any:
    """The same kind of handler, with admission, the current principal (:func:`current_principal`)
    and auditing (of writes, and of refusals by the handler) around the behaviour.

    Each call runs in its own asyncio task, with its own copy of the context, so setting the
    principal cannot reach another call; the coroutine handlers also reset it when they end.
    """
    kw = {"request_deserializer": handler.request_deserializer, "response_serializer": handler.response_serializer}
    if handler.unary_unary is not None:
        inner = handler.unary_unary

        async def unary_unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            principal = await ic.admit(method, context, request)
            token = _CURRENT.set(principal)
            try:
                response = await inner(request, context)
            except BaseException as e:
                await ic.failed(principal, method, context, request, e, audited)
                raise
            finally:
                _CURRENT.reset(token)
            if audited:
                ic.finish(principal, method, context, request, response, None)
            return response
        return grpc.unary_unary_rpc_method_handler(unary_unary, **kw)
    if handler.unary_stream is not None:
        inner_us = handler.unary_stream

        async def unary_stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
            principal = await ic.admit(method, context, request)
            async for item in _relay(ic, principal, method, context, request, lambda: inner_us(request, context),
                                     audited):
                yield item
            if audited:   # a streamed change: one record when the stream ends
                ic.finish(principal, method, context, request, None, None)
        return grpc.unary_stream_rpc_method_handler(unary_stream, **kw)
    if handler.stream_unary is not None:
        inner_su = handler.stream_unary

        async def stream_unary(requests: Any, context: grpc.aio.ServicerContext) -> Any:
            principal = await ic.admit(method, context)
            token = _CURRENT.set(principal)
            try:
                return await inner_su(requests, context)
            except BaseException as e:
                await ic.failed(principal, method, context, None, e, audited)
                raise
            finally:
                _CURRENT.reset(token)
        return grpc.stream_unary_rpc_method_handler(stream_unary, **kw)
    inner_ss = handler.stream_stream

    async def stream_stream(requests: Any, context: grpc.aio.ServicerContext) -> Any:
        principal = await ic.admit(method, context)
        first = _FirstRequest()

        async def seen() -> AsyncIterator[Any]:
            async for r in requests:
                first.keep(r)
                yield r
        async for item in _relay(ic, principal, method, context, first, lambda: inner_ss(seen(), context), audited):
            yield item
        if audited:   # a session (Session): one record when it ends, naming what its first message named
            ic.finish(principal, method, context, first, None, None)
    return grpc.stream_stream_rpc_method_handler(stream_stream, **kw)


class _FirstRequest:
    """A bidirectional call's first message as its audit record's request: what it opens (its ``open``
    field, where it has one) names the target; empty until a message came."""

    def __init__(self) -> None:
        self._msg: Any = None

    def keep(self, msg: Any) -> None:
        if self._msg is None:
            self._msg = getattr(msg, "open", msg)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._msg, name, None) if self._msg is not None else None


async def _relay(ic: AuthInterceptor, principal: Principal | None, method: str, context: grpc.aio.ServicerContext,
                 request: Any, call: Callable[[], Any], audited: bool) -> AsyncIterator[Any]:
    """A streaming handler run as ``principal``: its items (or its one awaited result), a failure audited."""
    _CURRENT.set(principal)
    try:
        result = call()
        if inspect.isasyncgen(result):
            async for item in result:
                yield item
        else:
            await result
    except BaseException as e:
        await ic.failed(principal, method, context, request, e, audited)
        raise


class Security:
    """The coordinator's TLS, authentication and audit, built once from the config.

    :param server_tls: reloadable server credentials, or None with ``--insecure``.
    :param authn: the authenticator.
    :param audit: the audit log.
    """

    def __init__(self, server_tls: ServerTls | None, authn: Authenticator, audit: AuditLog) -> None:
        self.server_tls = server_tls
        self.authn = authn
        self.audit = audit
        self.interceptor = AuthInterceptor(authn, audit)
        self._log = get_logger("auth")
        self._warned_plaintext = False

    @classmethod
    def from_config(cls, cfg: Any, events: Any = None) -> Security:
        """Build from a ``CoordinatorConfig``.

        :raises ConfigError: TLS settings incomplete (and not ``--insecure``), unreadable files,
            an invalid token file or CRL.
        """
        files = tls_files(insecure=cfg.insecure, cert=cfg.tls_cert, key=cfg.tls_key, ca=cfg.tls_ca)
        server_tls = ServerTls(files) if files is not None else None
        tokens = TokenFile(cfg.admin_tokens) if cfg.admin_tokens else None
        ca_pem = files.read()[2] if files is not None else None
        authn = Authenticator(tls=files is not None, tokens=tokens, crl=Path(cfg.tls_crl) if cfg.tls_crl else None,
                              ca_pem=ca_pem)
        return cls(server_tls, authn, AuditLog(cfg.audit_log or None, events))

    @property
    def insecure(self) -> bool:
        return self.server_tls is None

    def add_port(self, server: grpc.aio.Server, listen: str) -> int:
        """Bind ``listen`` with TLS (or plaintext when insecure); returns the port."""
        if self.server_tls is None:
            if not self._warned_plaintext:   # once, however many servers share the port
                self._warned_plaintext = True
                self._log.warning("plaintext_grpc_enabled", listen=listen, auth=self.authn.mode,
                                  reason="--insecure: no TLS; agents are not authenticated"
                                  + ("; admin callers are not authenticated either" if self.authn.open else ""))
            return server.add_insecure_port(listen)
        return server.add_secure_port(listen, self.server_tls.credentials())

    def node_principal(self, context: grpc.aio.ServicerContext) -> Principal | None:
        """The node certificate of an AgentGateway caller (None without TLS)."""
        return self.authn.certificate(context.auth_context())

    def reload(self) -> None:
        """SIGHUP: re-read certificates, CRL and tokens, reopen the audit log; errors keep the old ones."""
        for what, fn in (("tls", self.server_tls.reload if self.server_tls else None), ("auth", self.authn.reload),
                         ("audit_log", self.audit.reopen)):
            if fn is None:
                continue
            try:
                fn()
            except ConfigError as e:
                self._log.error("reload_failed", key=what, reason=str(e))
            else:
                self._log.info("reloaded", key=what)
