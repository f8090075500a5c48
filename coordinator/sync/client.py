"""The etcd client: multi-endpoint failover and one place that translates library errors.

This module and the other ``coordinator/sync`` modules are the only code that touches the
etcd3 library; everything else sees :class:`EtcdClient`, :class:`KV` and our errors.

Example::

    client = connect(["10.0.0.1:2379", "10.0.0.2:2379"], timeout_s=2.0)  # EtcdUnavailable if none answers
    kv = client.get("/gptrm/v1/leader")
    result = client.txn([cmp_create("/x", 0)], [op_put("/x", b"1")], [op_get("/x")])
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Protocol, TypeAlias, TypeVar

import etcd3
import etcd3.exceptions as etcd_exc
import grpc
from etcd3 import etcdrpc
from etcd3 import events as etcd_events
from etcd3.utils import prefix_range_end

from common.errors import ConfigError, CoordinationError, EtcdUnavailable
from common.logging import get_logger
from coordinator.sync._kv import (
    KV,
    Compare,
    KeyValueProto,
    Op,
    TxnResult,
    WatchCallback,
    WatchEvent,
    cmp_create,
    cmp_exists,
    cmp_mod,
    cmp_value,
    kv_from_meta,
    kv_from_proto,
    op_delete,
    op_get,
    op_put,
)

__all__ = [
    "KV",
    "Compare",
    "EtcdClient",
    "EtcdTls",
    "Op",
    "TxnResult",
    "WatchEvent",
    "WatchHandle",
    "cmp_create",
    "cmp_exists",
    "cmp_mod",
    "cmp_value",
    "connect",
    "op_delete",
    "op_get",
    "op_put",
]

T = TypeVar("T")
_Raw: TypeAlias = etcd3.MultiEndpointEtcd3Client

_PAGE = 500
_GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
# Codes that say "this endpoint (or its raft leader) did not serve us", so another may.
_RETRY_CODES = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.INTERNAL}
_RETRY_EXC = (
    etcd_exc.ConnectionFailedError,
    etcd_exc.ConnectionTimeoutError,
    etcd_exc.InternalServerError,
    etcd_exc.NoServerAvailableError,
    etcd_exc.WatchTimedOut,
)


class _Header(Protocol):
    revision: int


class _RangePage(Protocol):
    """What is read of etcd's ``RangeResponse`` (etcd3 ships no types)."""

    header: _Header
    kvs: Sequence[KeyValueProto]
    more: bool


class _ResponseOp(Protocol):
    """What is read of one of etcd's ``ResponseOp``."""

    response_range: _RangePage

    def WhichOneof(self, group: str) -> str | None: ...


class _TxnResponse(Protocol):
    """What is read of etcd's ``TxnResponse``."""

    header: _Header
    succeeded: bool
    responses: Sequence[_ResponseOp]


class _WatchResponse(Protocol):
    """What is read of etcd3's watch response: its events (each proxies an ``mvccpb.KeyValue``)."""

    events: Sequence[KeyValueProto]


def _range_page(raw: _Raw, _timeout: float, *, start: bytes, end: bytes, revision: int) -> _RangePage:
    return raw.get_range_response(start, end, limit=_PAGE, revision=revision or None)


def _txn(raw: _Raw, _timeout: float, *, request: object) -> _TxnResponse:
    # The request goes to etcd's KV stub as it was built (see _kv.py); a gRPC error goes through
    # etcd3's own translation and endpoint bookkeeping, as in its transaction().
    try:
        return raw.kvstub.Txn(request, raw.timeout, credentials=raw.call_credentials, metadata=raw.metadata)
    except grpc.RpcError as e:
        raw._manage_grpc_errors(e)
        raise


@dataclass(frozen=True, slots=True)
class EtcdTls:
    """TLS towards etcd: the CA that verifies its server certificates, and our client certificate.

    :param ca_cert: PEM CA bundle (``--etcd-cacert``).
    :param cert: PEM client certificate (``--etcd-cert``), for etcd's ``--client-cert-auth``.
    :param key: PEM private key of ``cert`` (``--etcd-key``).
    """

    ca_cert: str
    cert: str = ""
    key: str = ""

    def credentials(self) -> grpc.ChannelCredentials:
        """:raises ConfigError: naming the setting whose file cannot be read."""
        data: dict[str, bytes | None] = {}
        for name, path in (("etcd_cacert", self.ca_cert), ("etcd_cert", self.cert), ("etcd_key", self.key)):
            try:
                data[name] = Path(path).expanduser().read_bytes() if path else None
            except OSError as e:
                raise ConfigError(f"{name}: cannot read {path!r}: {e.strerror}") from None
        return grpc.ssl_channel_credentials(root_certificates=data["etcd_cacert"], private_key=data["etcd_key"],
                                            certificate_chain=data["etcd_cert"])


def _parse_endpoint(text: str, secure: bool = False) -> tuple[str, int]:
    raw = text.strip()
    if raw.startswith("https://") and not secure:
        raise ConfigError(f"etcd endpoint {text!r}: https:// needs TLS settings (--etcd-cacert)")
    if raw.startswith("http://") and secure:
        raise ConfigError(f"etcd endpoint {text!r}: plaintext http:// endpoint with TLS settings")
    raw = raw.removeprefix("https://").removeprefix("http://").rstrip("/")
    host, sep, port = raw.rpartition(":")
    if not sep:
        host, port = raw, "2379"
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"etcd endpoint {text!r} is not HOST:PORT")
    return host, int(port)


def _reason(e: BaseException) -> str:
    """A one-line reason from an etcd3/grpc exception (etcd3 hides grpc details in __context__)."""
    for err in (e, e.__context__):
        if isinstance(err, grpc.RpcError) and hasattr(err, "code"):
            details = (err.details() or "").splitlines()
            return f"{err.code().name}: {details[0] if details else 'no details'}"
    return str(e) or type(e).__name__


def _retryable(e: BaseException) -> bool:
    if isinstance(e, _RETRY_EXC):
        return True
    return isinstance(e, grpc.RpcError) and hasattr(e, "code") and e.code() in _RETRY_CODES


class WatchHandle:
    """A registered watch; :meth:`cancel` stops it (idempotent, never raises)."""

    def __init__(self, raw: _Raw, watch_id: int) -> None:
        self._raw = raw
        self._watch_id = watch_id
        self._cancelled = False

    def cancel(self) -> None:
        """Stop delivering events."""
        if self._cancelled:
            return
        self._cancelled = True
        try:
            self._raw.cancel_watch(self._watch_id)
        except Exception:  # best effort; a broken stream has no watch left to cancel
            return


class EtcdClient:
    """A thread-safe etcd client over one or more endpoints of the same cluster.

    Each call goes to the current endpoint; when that endpoint does not answer (unavailable,
    deadline exceeded, no raft leader) the client switches to the next one and retries,
    round after round with a short pause between rounds, until ``timeout_s`` has passed since
    the call began (one attempt may itself take up to ``timeout_s``).
    Retrying a write is safe because every gptrm write is a transaction guarded by compares:
    a write that was applied but whose answer was lost cannot apply twice; its retry finds
    the compares false, and callers recognise their own value (see ``Store``).

    Example::

        client = EtcdClient(["127.0.0.1:2379"], timeout_s=2.0)
        client.probe()
        kvs, revision = client.range_prefix("/gptrm/v1/tasks/")

    :param endpoints: ``host:port``, ``http://host:port`` or (with ``tls``) ``https://host:port`` of members.
    :param timeout_s: deadline of one attempt, and the retry budget of one call.
    :param tls: verify etcd's certificates (and present ours); None is plaintext.
    :raises ConfigError: no endpoint, one that is not ``HOST:PORT``, or a scheme that contradicts ``tls``.
    """

    def __init__(self, endpoints: Sequence[str], timeout_s: float = 5.0, tls: EtcdTls | None = None) -> None:
        if not endpoints:
            raise ConfigError("etcd endpoints: the list is empty")
        if not timeout_s > 0:
            raise ConfigError(f"etcd timeout_s: {timeout_s} must be positive")
        parsed = [_parse_endpoint(e, tls is not None) for e in endpoints]
        creds = tls.credentials() if tls is not None else None
        self._endpoints = [f"{h}:{p}" for h, p in parsed]
        self._timeout_s = float(timeout_s)
        # One single-endpoint etcd3 client per member; time_retry=0 so that a failed member is
        # tried again on the next rotation instead of being shunned for etcd3's default 300 s.
        self._raws = [
            _Raw([etcd3.Endpoint(h, p, secure=creds is not None, creds=creds, time_retry=0, opts=_GRPC_OPTIONS)],
                 timeout=timeout_s)
            for h, p in parsed
        ]
        self._index = 0
        self._closed = False
        self._lock = threading.Lock()
        self._log = get_logger("sync")

    @property
    def endpoints(self) -> list[str]:
        """The configured endpoints, ``host:port``."""
        return list(self._endpoints)

    @property
    def timeout_s(self) -> float:
        """Deadline of one attempt of one call."""
        return self._timeout_s

    @property
    def current_endpoint(self) -> str:
        """The endpoint the next call goes to first."""
        with self._lock:
            return self._endpoints[self._index]

    def _fail_over(self, index: int, reason: str) -> None:
        with self._lock:
            if self._index != index:
                return  # another thread already moved on
            self._index = (index + 1) % len(self._raws)
            nxt = self._endpoints[self._index]
        self._log.warning("etcd_endpoint_failed", endpoint=self._endpoints[index], next_endpoint=nxt, reason=reason)

    def _call(self, what: str, fn: Callable[[_Raw, float], T], *, timeout_s: float | None = None) -> T:
        """Run ``fn(raw_client, timeout)``, failing over between endpoints; the one error translator.

        :raises EtcdUnavailable: no endpoint answered within the budget.
        :raises CoordinationError: etcd answered with an error (bad request, missing lease, ...).
        """
        if self._closed:
            raise CoordinationError(f"etcd {what} failed: the client was closed")
        budget = self._timeout_s if timeout_s is None else timeout_s
        started = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            with self._lock:
                index = self._index
            try:
                return fn(self._raws[index], budget)
            except Exception as e:  # classified, and re-raised as ours, just below
                reason = _reason(e)
                if not _retryable(e):
                    raise CoordinationError(f"etcd {what} failed at {self._endpoints[index]}: {reason}") from e
                self._fail_over(index, reason)
                left = budget - (time.monotonic() - started)
                if left <= 0:
                    raise EtcdUnavailable(f"etcd not reachable at {','.join(self._endpoints)}: {reason}") from e
                if attempt % len(self._raws) == 0:
                    # Every endpoint failed once more: give a raft election (~1 s) a moment.
                    time.sleep(min(0.05 * attempt / len(self._raws), 0.25, left))

    def probe(self) -> str:
        """Ask each endpoint in turn for its status until one answers, within ``timeout_s`` in all.

        :returns: the etcd server version of the endpoint that answered (it becomes current).
        :raises EtcdUnavailable: no endpoint answered.
        """
        deadline = time.monotonic() + self._timeout_s
        reasons: list[str] = []
        for offset in range(len(self._raws)):
            index = (self._index + offset) % len(self._raws)
            share = max((deadline - time.monotonic()) / (len(self._raws) - offset), 0.05)
            try:
                raw = self._raws[index]
                status = raw.maintenancestub.Status(etcdrpc.StatusRequest(), share, metadata=raw.metadata)
            except Exception as e:  # collected into the one error below
                reasons.append(f"{self._endpoints[index]}: {_reason(e)}")
                continue
            with self._lock:
                self._index = index
            self._log.info("etcd_connected", endpoint=self._endpoints[index], version=status.version)
            return str(status.version)
        raise EtcdUnavailable(f"etcd not reachable at {','.join(self._endpoints)}: {'; '.join(reasons)}")

    def get(self, key: str) -> KV | None:
        """The key, or None when it does not exist."""
        value, meta = self._call("get", lambda raw, _t: raw.get(key))
        return None if meta is None else kv_from_meta(value, meta)

    def range_prefix(self, prefix: str, *, revision: int = 0) -> tuple[list[KV], int]:
        """Every key under ``prefix`` at one revision, read in pages.

        :param revision: read at this revision (0: the newest).
        :returns: the keys in key order, and the revision they were read at.
        """
        start, end = prefix.encode(), prefix_range_end(prefix.encode())
        out: list[KV] = []
        while True:
            resp = self._call("range", partial(_range_page, start=start, end=end, revision=revision))
            revision = revision or resp.header.revision
            out.extend(kv_from_proto(kv) for kv in resp.kvs)
            if not resp.more or not resp.kvs:
                return out, revision
            start = resp.kvs[-1].key + b"\0"

    def txn(self, compare: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()) -> TxnResult:
        """One etcd transaction: if every compare holds run ``success``, else ``failure``."""
        request = etcdrpc.TxnRequest(compare=compare, success=success, failure=failure)
        response = self._call("txn", partial(_txn, request=request))
        out: list[list[KV] | None] = []
        for resp in response.responses:
            if resp.WhichOneof("response") == "response_range":
                out.append([kv_from_proto(kv) for kv in resp.response_range.kvs])
            else:
                out.append(None)
        return TxnResult(bool(response.succeeded), response.header.revision, out)

    def grant_lease(self, ttl_s: int) -> tuple[int, int]:
        """Grant a lease; returns its id and the TTL etcd granted (it may raise a too small TTL)."""
        lease = self._call("lease grant", lambda raw, _t: raw.lease(ttl_s))
        return int(lease.id), int(lease.ttl)

    def refresh_lease(self, lease_id: int, *, timeout_s: float | None = None) -> int:
        """Send one keep-alive; returns the remaining TTL, 0 when etcd no longer knows the lease."""

        def keep_alive(raw: _Raw, timeout: float) -> int:
            call = raw.leasestub.LeaseKeepAlive(
                iter([etcdrpc.LeaseKeepAliveRequest(ID=lease_id)]), timeout, metadata=raw.metadata
            )
            try:
                return int(next(call).TTL)
            except StopIteration:
                return 0
            finally:
                call.cancel()

        return self._call("lease refresh", keep_alive, timeout_s=timeout_s)

    def revoke_lease(self, lease_id: int) -> None:
        """Revoke a lease, deleting every key bound to it; a lease etcd no longer knows is fine."""
        try:
            self._call("lease revoke", lambda raw, _t: raw.revoke_lease(lease_id))
        except EtcdUnavailable:
            raise
        except CoordinationError as e:
            if "lease not found" not in str(e):
                raise

    def watch(self, key: str, callback: WatchCallback) -> WatchHandle:
        """Call ``callback`` with every change of ``key`` from now on, or with None once the watch breaks."""

        def deliver(resp: _WatchResponse | Exception | None) -> None:
            if resp is None or isinstance(resp, Exception):
                callback(None)
                return
            events = [
                WatchEvent("delete" if isinstance(ev, etcd_events.DeleteEvent) else "put", kv_from_proto(ev))
                for ev in resp.events
            ]
            callback(events)

        def add(raw: _Raw, _t: float) -> WatchHandle:
            return WatchHandle(raw, raw.add_watch_callback(key, deliver))

        return self._call("watch", add)

    def close(self) -> None:
        """Close every channel; later calls raise ``CoordinationError``. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for raw in self._raws:
            raw.close()


def connect(endpoints: Sequence[str], timeout_s: float = 5.0, tls: EtcdTls | None = None) -> EtcdClient:
    """An :class:`EtcdClient` that has just reached one of ``endpoints``.

    Example::

        try:
            client = connect(cfg.etcd_endpoints, timeout_s=cfg.etcd_timeout_s)
        except EtcdUnavailable as e:
            sys.exit(f"gptrm-coordinator: {e}")

    :raises ConfigError: the endpoint list is empty or malformed.
    :raises EtcdUnavailable: ``etcd not reachable at HOST:PORT,...: reason``, within about ``timeout_s``.
    """
    client = EtcdClient(endpoints, timeout_s, tls)
    try:
        client.probe()
    except EtcdUnavailable:
        client.close()
        raise
    return client
