"""The web console (``--web-listen``): read-only pages of the fleet, queues, tasks, services and events,
served by the coordinator over its Admin servicer (``docs/web.md``)."""

from coordinator.web.console import WebConsole

__all__ = ["WebConsole"]
