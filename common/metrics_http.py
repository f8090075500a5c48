"""The HTTP server both the coordinator's and the agent's ``/metrics`` endpoints run on: a WSGI app served from a
daemon thread on ``HOST:PORT`` (IPv4 or IPv6), logging no access lines (scrapes come every few seconds)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client.exposition import ThreadingWSGIServer

__all__ = ["QuietHandler", "serve_wsgi"]


class QuietHandler(WSGIRequestHandler):
    """A request handler that logs nothing."""

    def log_message(self, format: str, *args: Any) -> None:
        """Log nothing."""


def serve_wsgi(listen: str, app: Callable[..., list[bytes]],
               handler: type[WSGIRequestHandler] = QuietHandler) -> ThreadingWSGIServer:
    """Serve ``app`` on ``HOST:PORT`` from a daemon thread.

    :param listen: ``HOST:PORT`` (``[::1]:PORT`` for IPv6; port 0 picks a free one; an empty host is every IPv4
        address).
    :returns: the server (``server_address`` says where it listens; ``shutdown()`` stops it).
    :raises OSError: the address cannot be bound.
    """
    host, _, port = listen.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"

    class Server(ThreadingWSGIServer):
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

    server = make_server(host, int(port), app, Server, handler_class=handler)
    threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
    return server
