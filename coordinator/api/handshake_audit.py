"""Audit records for TLS handshakes that gRPC refuses before any Python code runs.

An expired certificate, one from another CA, or a plaintext client connecting to the TLS port
never reaches the auth interceptor: gRPC's core refuses the handshake and says so only in its
own log line on standard error (``ssl_transport_security.cc] Handshake failed with error
SSL_ERROR_SSL: ... CERTIFICATE_VERIFY_FAILED: ...``). :class:`HandshakeAuditTap` puts a pipe in
front of file descriptor 2, passes every byte on to the real standard error unchanged, and turns
each such line into one audit record (principal ``-``, method ``tls-handshake``, outcome
``refused``, the library's reason). gRPC names no peer in that line, so neither can the record.

Records are rate-limited (a burst of bad connections must not fill the audit log): past
``max_per_s`` a second, refusals are counted and one summary record says how many were folded.
The reader thread never stops on its own; if it fails, the original standard error is put back,
so a writer to descriptor 2 can never block on a pipe nobody reads.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from collections.abc import Callable
from typing import Any

from common.logging import get_logger

__all__ = ["HandshakeAuditTap", "HandshakeRefusals"]

_HANDSHAKE = re.compile(rb"Handshake failed with error (.{1,400})")
_REASONS = ((b"CERTIFICATE_VERIFY_FAILED", "client certificate not trusted"),
            (b"WRONG_VERSION_NUMBER", "not a TLS client (plaintext?)"),
            (b"PEER_DID_NOT_RETURN_A_CERTIFICATE", "client sent no certificate"),
            (b"CERTIFICATE_EXPIRED", "client certificate expired"))
_MAX_LINE = 64 << 10


def _reason(detail: bytes) -> str:
    text = detail.decode("ascii", errors="replace").strip()
    for key, summary in _REASONS:
        if key in detail:
            return f"TLS handshake refused: {summary} ({text})"
    return f"TLS handshake refused: {text}"


class HandshakeRefusals:
    """Turns gRPC core log lines into rate-limited audit records.

    :param audit: the coordinator's :class:`~coordinator.api.audit.AuditLog` (``record(**fields)``).
    :param max_per_s: records written per second before refusals are only counted.
    :param now: monotonic clock, injected in tests.
    """

    def __init__(self, audit: Any, *, max_per_s: int = 5, now: Callable[[], float] = time.monotonic) -> None:
        self._audit = audit
        self._max = max_per_s
        self._now = now
        self._window = -1.0
        self._written = 0
        self.folded = 0

    def feed(self, line: bytes) -> None:
        """One line of gRPC's log; lines that are not a refused handshake are ignored."""
        m = _HANDSHAKE.search(line)
        if m is None:
            return
        t = self._now()
        if t - self._window >= 1.0:
            self._flush_folded()
            self._window, self._written = t, 0
        if self._written >= self._max:
            self.folded += 1
            return
        self._written += 1
        self._audit.record(principal="-", role="", method="tls-handshake", outcome="refused",
                           reason=_reason(m.group(1)))

    def _flush_folded(self) -> None:
        if self.folded:
            self._audit.record(principal="-", role="", method="tls-handshake", outcome="refused",
                               reason=f"{self.folded} more refused TLS handshakes in the last second (rate-limited)")
            self.folded = 0


class HandshakeAuditTap:
    """Reads descriptor 2 through a pipe, forwarding everything, auditing refused handshakes.

    :param refusals: where handshake lines go.
    :param fd: the descriptor to tap (2; tests may pass another).
    """

    def __init__(self, refusals: HandshakeRefusals, fd: int = 2) -> None:
        self._refusals = refusals
        self._fd = fd
        self._saved: int | None = None
        self._thread: threading.Thread | None = None
        self._log = get_logger("audit")

    def start(self) -> None:
        """Put the pipe in front of the descriptor and start the reader thread."""
        saved = os.dup(self._fd)
        r, w = os.pipe()
        self._saved = saved
        self._thread = threading.Thread(target=self._pump, args=(r,), name="handshake-audit", daemon=True)
        self._thread.start()
        os.dup2(w, self._fd)
        os.close(w)

    def stop(self) -> None:
        """Give the descriptor its original target back, let the reader forward what is left, then end."""
        saved = self._saved
        if saved is None:
            return
        os.dup2(saved, self._fd)   # closes the pipe's write end here: the reader drains it and sees EOF
        if self._thread is not None:
            self._thread.join(timeout=2.0)   # children holding a copy of the write end may delay EOF
        if self._thread is None or not self._thread.is_alive():
            self._saved = None
            os.close(saved)   # (a reader still alive keeps it: its number must not be reused under it)

    def _pump(self, r: int) -> None:
        pending = b""
        try:
            while True:
                chunk = os.read(r, 65536)
                if not chunk:
                    break
                out = self._saved
                if out is not None:
                    _write_all(out, chunk)
                pending += chunk
                *lines, pending = pending.split(b"\n")
                pending = pending[-_MAX_LINE:]
                for line in lines:
                    try:
                        self._refusals.feed(line)
                    except Exception as e:   # an audit problem must never stop the forwarding
                        self._log.error("handshake_audit_failed", reason=str(e))
        except OSError as e:
            self._log.error("handshake_audit_failed", reason=e.strerror or str(e))
            saved = self._saved
            if saved is not None:
                with contextlib.suppress(OSError):
                    os.dup2(saved, self._fd)   # nobody reads the pipe any more: writers get stderr back
        finally:
            with contextlib.suppress(OSError):
                os.close(r)


def _write_all(fd: int, data: bytes) -> None:
    with contextlib.suppress(OSError):
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
