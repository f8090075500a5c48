"""The audit trail: one JSON line per state-changing Admin call and per refused call.

Each record has ``time`` (ISO 8601 UTC), ``time_unix_s``, ``principal``, ``role``, ``method``,
``target``, ``outcome`` (``ok``, ``error`` or ``refused``) and ``reason``. It goes to the
append-only ``--audit-log`` file (opened ``O_APPEND``, mode 0600, flushed per line; reopened
on SIGHUP so log rotation works) and to the event stream as an ``audit`` event.

Example::

    audit = AuditLog(Path("/var/lib/gptrm/audit.log"), events)
    audit.record(principal="alice", role="admin", method="CancelTask", target="t-1", outcome="ok")
"""

from __future__ import annotations

import datetime as dt
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common.errors import ConfigError
from common.logging import get_logger

__all__ = ["OUTCOMES", "AuditLog"]

OUTCOMES = ("ok", "error", "refused")
_MAX_FIELD = 512   # a caller controls target and reason text: keep each line bounded


def _clip(value: object) -> str:
    text = str(value)
    return text if len(text) <= _MAX_FIELD else text[:_MAX_FIELD] + "…"


class AuditLog:
    """Writes audit records to a file and the event bus.

    :param path: the audit file (None: event stream and process log only).
    :param events: the coordinator's ``EventBus`` (None in unit tests that only check the file).
    :param now: wall clock, injected in tests.
    :raises ConfigError: the file cannot be opened for appending.
    """

    def __init__(self, path: Path | str | None, events: Any = None, now: Callable[[], float] = time.time) -> None:
        self.path = Path(path) if path else None
        self._events = events
        self._now = now
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._log = get_logger("audit")
        self.reopen()

    def reopen(self) -> None:
        """(Re)open the file for appending (after rotation, on SIGHUP)."""
        if self.path is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        except OSError as e:
            raise ConfigError(f"audit_log: cannot open {str(self.path)!r} for appending: {e.strerror}") from None
        with self._lock:
            old, self._fd = self._fd, fd
        if old is not None:
            os.close(old)

    def record(self, *, principal: str, role: str, method: str, target: str = "", outcome: str,
               reason: str = "") -> dict[str, Any]:
        """Write one record; returns it. Never raises: an unwritable file is logged, not fatal."""
        if outcome not in OUTCOMES:
            raise ValueError(f"unknown audit outcome {outcome!r}")
        t = self._now()
        rec = {"time": dt.datetime.fromtimestamp(t, dt.UTC).isoformat(timespec="milliseconds"),
               "time_unix_s": round(t, 3), "principal": _clip(principal), "role": _clip(role),
               "method": _clip(method), "target": _clip(target), "outcome": outcome, "reason": _clip(reason)}
        line = (json.dumps(rec, sort_keys=True, ensure_ascii=True) + "\n").encode()
        with self._lock:
            if self._fd is not None:
                try:
                    os.write(self._fd, line)   # one write per line: O_APPEND keeps lines whole
                except OSError as e:
                    self._log.error("audit_write_failed", reason=e.strerror, key=str(self.path))
        if outcome == "refused":
            self._log.warning("call_refused", principal=rec["principal"], role=role, method=method,
                              target=rec["target"], reason=rec["reason"])
        if self._events is not None:
            self._events.publish("audit", f"{rec['principal']} ({role or '-'}) {method}"
                                 + (f" {rec['target']}" if rec["target"] else "") + f": {outcome}"
                                 + (f" ({rec['reason']})" if rec["reason"] else ""),
                                 principal=rec["principal"], role=role, method=method, target=rec["target"],
                                 outcome=outcome, reason=rec["reason"])
        return rec

    def close(self) -> None:
        with self._lock:
            fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
