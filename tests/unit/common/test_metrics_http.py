"""The /metrics HTTP server: one log line per failed connection, local connections refused by uid."""

from __future__ import annotations

import os
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from common.metrics_http import QuietHandler, peer_socket_uid, serve_wsgi


def _ok(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"ok\n"]


class _Impatient(QuietHandler):
    timeout = 0.2


@pytest.fixture
def served() -> Iterator[Any]:
    srv = serve_wsgi("127.0.0.1:0", _ok, _Impatient, refuse=lambda uid: uid == os.geteuid() + 1)
    yield srv
    srv.shutdown()
    srv.server_close()


class TestMetricsHttp:
    def test_a_slow_connection_is_one_log_line_not_a_traceback(self, served: Any,
                                                                capfd: pytest.CaptureFixture[str]) -> None:
        with capture_logs() as logs, socket.create_connection(served.server_address) as conn:
            conn.sendall(b"GET /met")   # and nothing more: the handler times out
            deadline = time.monotonic() + 10
            while not logs and time.monotonic() < deadline:   # the handler times out after 0.2 s
                time.sleep(0.05)
        assert [(e["event"], e["log_level"]) for e in logs] == [("metrics_connection_failed", "warning")]
        assert logs[0]["peer"].startswith("127.0.0.1:") and logs[0]["error"].startswith("TimeoutError")
        assert "Traceback" not in capfd.readouterr().err

    def test_the_uid_of_a_local_peer_is_found(self, served: Any) -> None:
        with socket.create_connection(served.server_address) as conn:
            assert peer_socket_uid(conn.getsockname(), conn.getpeername()) == os.geteuid()

    def test_a_peer_on_another_host_has_no_local_uid(self, tmp_path: Path) -> None:
        (tmp_path / "tcp").write_text("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt"
                                      "   uid  timeout inode\n   0: 0100007F:1F90 0100007F:A1B2 01 0:0 0:0 0 7 0 1\n")
        assert peer_socket_uid(("127.0.0.1", 0xA1B2), ("127.0.0.1", 0x1F90), tmp_path) is None
        assert peer_socket_uid(("127.0.0.1", 0x1F90), ("127.0.0.1", 0xA1B2), tmp_path) == 7
        assert peer_socket_uid(("10.0.0.9", 0x1F90), ("127.0.0.1", 0xA1B2), tmp_path) is None

    def test_a_uid_not_refused_is_served(self, served: Any) -> None:
        host, port = served.server_address
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as resp:
            assert resp.status == 200 and resp.read() == b"ok\n"

    @pytest.mark.parametrize("host", ["127.0.0.1", "[::1]"])
    def test_a_refused_uid_gets_403(self, host: str) -> None:
        """The peer's socket is found in /proc/net/tcp (IPv4) and tcp6 (IPv6) alike."""
        try:
            srv = serve_wsgi(f"{host}:0", _ok, refuse=lambda uid: uid == os.geteuid())
        except OSError:
            pytest.skip(f"{host} cannot be bound here")
        try:
            port = srv.server_address[1]
            with capture_logs() as logs, pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10)
            assert err.value.code == 403
            assert [e["event"] for e in logs] == ["metrics_scrape_refused"] and logs[0]["uid"] == os.geteuid()
        finally:
            srv.shutdown()
            srv.server_close()
