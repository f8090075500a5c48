"""structlog setup shared by every gptrm process.

JSON lines when stdout is not a terminal (journald, files, CI), the console renderer on a
TTY. Events are constant snake_case phrases; data goes in keys (see CONTRIBUTING.md, Logging).
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog

__all__ = ["configure_logging", "get_logger"]

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def configure_logging(level: str = "info", *, json: bool | None = None, stream: TextIO | None = None) -> None:
    """Configure structlog for this process.

    :param level: minimum level name (debug, info, warning, error).
    :param json: force JSON (True) or console (False); None picks by whether ``stream`` is a TTY.
    :param stream: where log lines go (default stderr, so stdout stays free for program output).
    """
    out = stream or sys.stderr
    if json is None:
        json = not out.isatty()
    renderer: structlog.typing.Processor
    if json:
        renderer = structlog.processors.JSONRenderer(sort_keys=True)
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=out.isatty())
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS.get(level, logging.INFO)),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        cache_logger_on_first_use=False,
    )


def get_logger(component: str) -> structlog.typing.FilteringBoundLogger:
    """A logger bound to ``component`` (``agent``, ``coordinator``, ...)."""
    return structlog.get_logger().bind(component=component)
