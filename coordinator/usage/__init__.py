"""Usage and cost accounting: GPU-seconds, CPU core-seconds, energy and tasks per hour, queue, user and GPU
model (``ledger``), persisted per hour in etcd by a leader duty (``duty``), reported with prices (``report``)."""

from coordinator.usage.duty import AccountedPass, UsageDuty, UsageMetrics
from coordinator.usage.ledger import RowKey, Usage, account
from coordinator.usage.report import Prices, ReportRow, summarize

__all__ = ["AccountedPass", "Prices", "ReportRow", "RowKey", "Usage", "UsageDuty", "UsageMetrics", "account",
           "summarize"]
