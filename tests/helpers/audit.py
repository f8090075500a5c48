"""An audit log that keeps its records in memory, for tests of what gets audited."""

from __future__ import annotations

from typing import Any


class RecordingAudit:
    """Stands in for ``coordinator.api.audit.AuditLog``: every ``record(...)`` call's fields, in order."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def record(self, **fields: Any) -> dict[str, Any]:
        self.records.append(fields)
        return fields
