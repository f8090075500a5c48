"""The HTTP server both the coordinator's and the agent's ``/metrics`` endpoints run on: a WSGI app served from a
daemon thread on ``HOST:PORT`` (IPv4 or IPv6), logging no access lines (scrapes come every few seconds).

- A connection that fails (a client that sends nothing within the handler's timeout, one that goes away
  mid-request) is one warning line, ``metrics_connection_failed`` with the peer and the error, never a traceback.
- ``refuse`` keeps local users out: a connection from this host is looked up in the kernel's socket tables
  (``/proc/net/tcp`` and ``tcp6``: the peer's own socket, found by its address and port, names the uid that
  opened it), and one opened by a uid ``refuse`` names gets ``403 Forbidden`` and is closed. A peer on another
  host is not in those tables and is served, so a Prometheus elsewhere (or on this host as its own user)
  scrapes unchanged.
"""

from __future__ import annotations

import ipaddress
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client.exposition import ThreadingWSGIServer

from common.logging import get_logger

__all__ = ["QuietHandler", "peer_socket_uid", "serve_wsgi"]

_FORBIDDEN = (b"HTTP/1.0 403 Forbidden\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: 42\r\n"
              b"Connection: close\r\n\r\nthis endpoint is not served to local tasks\n")
_REFUSAL_LOG_S = 60.0
"""A uid's refused connections are logged at most once per this many seconds (a task may retry in a loop)."""
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class QuietHandler(WSGIRequestHandler):
    """A request handler that logs nothing."""

    def log_message(self, format: str, *args: Any) -> None:
        """Log nothing."""


def _address(text: str) -> tuple[Address, int]:
    """A ``/proc/net/tcp`` address (``0100007F:1F90``: 32-bit words in host order, the port big-endian)."""
    ip_hex, _, port_hex = text.partition(":")
    raw = bytes.fromhex(ip_hex)
    if sys.byteorder == "little":
        raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return _plain(ipaddress.ip_address(raw)), int(port_hex, 16)


def _plain(ip: Address) -> Address:
    """An IPv4-mapped IPv6 address as the IPv4 address it maps."""
    return ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped else ip


def peer_socket_uid(peer: tuple[Any, ...], local: tuple[Any, ...], proc_net: Path = Path("/proc/net")) -> int | None:
    """The uid owning the socket at the other end of a TCP connection from ``peer`` to ``local`` when that socket
    is on this host (in this network namespace); None for a peer elsewhere, or a connection already gone."""
    want_peer = (_plain(ipaddress.ip_address(str(peer[0]).split("%")[0])), int(peer[1]))
    want_local = (_plain(ipaddress.ip_address(str(local[0]).split("%")[0])), int(local[1]))
    for table in ("tcp", "tcp6"):
        try:
            rows = (proc_net / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            try:
                if _address(fields[1]) == want_peer and _address(fields[2]) == want_local:
                    return int(fields[7])
            except (ValueError, IndexError):
                continue
    return None


def serve_wsgi(listen: str, app: Callable[..., list[bytes]], handler: type[WSGIRequestHandler] = QuietHandler, *,
               component: str = "metrics", refuse: Callable[[int], bool] | None = None) -> ThreadingWSGIServer:
    """Serve ``app`` on ``HOST:PORT`` from a daemon thread.

    :param listen: ``HOST:PORT`` (``[::1]:PORT`` for IPv6; port 0 picks a free one; an empty host is every IPv4
        address).
    :param component: the logger's component for the lines this server logs.
    :param refuse: uids whose local connections are refused (see the module docstring); None serves everyone.
    :returns: the server (``server_address`` says where it listens; ``shutdown()`` stops it).
    :raises OSError: the address cannot be bound.
    """
    host, _, port = listen.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    log = get_logger(component)
    refusals: dict[int, float] = {}

    class Server(ThreadingWSGIServer):
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

        def finish_request(self, request: Any, client_address: Any) -> None:
            """On the connection's own thread: refuse a local task's connection, else serve it."""
            if refuse is not None:
                uid = peer_socket_uid(client_address, request.getsockname())
                if uid is not None and refuse(uid):
                    now = time.monotonic()
                    if now - refusals.get(uid, -_REFUSAL_LOG_S) >= _REFUSAL_LOG_S:
                        refusals[uid] = now
                        log.warning("metrics_scrape_refused", uid=uid, peer=_peer(client_address),
                                    reason="the connection comes from a task's uid")
                    try:
                        request.settimeout(1.0)
                        request.sendall(_FORBIDDEN)
                    except OSError:
                        pass
                    return
            super().finish_request(request, client_address)

        def handle_error(self, request: Any, client_address: Any) -> None:
            """One line instead of socketserver's traceback on stderr."""
            error = sys.exc_info()[1]
            log.warning("metrics_connection_failed", peer=_peer(client_address),
                        error=f"{type(error).__name__}: {error}" if error is not None else "")

    server = make_server(host, int(port), app, Server, handler_class=handler)
    threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
    return server


def _peer(client_address: Any) -> str:
    try:
        return f"{client_address[0]}:{client_address[1]}"
    except (TypeError, IndexError):
        return str(client_address)
