"""Refused TLS handshakes, seen only in gRPC's own log line, become rate-limited audit records."""

from __future__ import annotations

import os
from pathlib import Path

from coordinator.api.handshake_audit import HandshakeAuditTap, HandshakeRefusals
from tests.helpers.audit import RecordingAudit
from tests.helpers.clock import FakeClock

_LINE = (b"I1123 21:26:37.604990   13947 ssl_transport_security.cc:2563] Handshake failed with error "
         b"SSL_ERROR_SSL: error:1000007d:SSL routines:OPENSSL_internal:CERTIFICATE_VERIFY_FAILED: "
         b"certificate has expired")


class TestHandshakeRefusals:
    def test_handshake_lines_become_refused_records(self) -> None:
        """A handshake failure is one refused tls-handshake record with the library's reason; other lines are not."""
        audit = RecordingAudit()
        refusals = HandshakeRefusals(audit, now=FakeClock())
        refusals.feed(b"I1123 chttp2_server.cc:1] some other line")
        refusals.feed(_LINE)
        refusals.feed(b"... Handshake failed with error SSL_ERROR_SSL: error:100000f7:SSL routines:"
                      b"OPENSSL_internal:WRONG_VERSION_NUMBER")
        assert [(r["principal"], r["method"], r["outcome"]) for r in audit.records] == \
            [("-", "tls-handshake", "refused")] * 2
        assert "client certificate not trusted" in audit.records[0]["reason"]
        assert "certificate has expired" in audit.records[0]["reason"]
        assert "not a TLS client" in audit.records[1]["reason"]

    def test_bursts_are_folded_into_one_summary(self) -> None:
        """Past the per-second budget refusals are counted, and one summary record says how many."""
        audit, clock = RecordingAudit(), FakeClock()
        refusals = HandshakeRefusals(audit, max_per_s=3, now=clock)
        for _ in range(10):
            refusals.feed(_LINE)
        assert len(audit.records) == 3 and refusals.folded == 7
        clock.advance(1.5)
        refusals.feed(_LINE)
        assert "7 more refused TLS handshakes" in audit.records[3]["reason"]
        assert len(audit.records) == 5 and refusals.folded == 0


class TestHandshakeAuditTap:
    def test_everything_is_forwarded_and_handshakes_audited(self, tmp_path: Path) -> None:
        """Bytes written to the tapped descriptor reach its original file unchanged; handshake lines are audited."""
        target = tmp_path / "stderr"
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        audit = RecordingAudit()
        tap = HandshakeAuditTap(HandshakeRefusals(audit), fd=fd)
        tap.start()
        payload = b"plain line\n" + _LINE + b"\npartial"
        os.write(fd, payload)
        tap.stop()
        os.write(fd, b"|after")    # the descriptor is the file again
        os.close(fd)
        assert target.read_bytes() == payload + b"|after"
        assert len(audit.records) == 1 and audit.records[0]["method"] == "tls-handshake"
