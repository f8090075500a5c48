"""structlog setup shared by every gptrm process.

JSON lines when the log stream is not a terminal (journald, files, CI), the console renderer
on a TTY. Events are constant snake_case phrases; data goes in keys (see CONTRIBUTING.md,
Logging).

One stream: gptrm's own events and what libraries log through the standard library
(grpc, etcd3, asyncio) all pass through ``logging`` to one handler whose
``structlog.stdlib.ProcessorFormatter`` renders them with the same processors, so a library's
line is JSON too, carries the context bound with ``structlog.contextvars``, and names its
logger in ``component``, the key gptrm's own lines name their component in.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

__all__ = ["configure_logging", "get_logger"]

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}

# The standard-library logger gptrm's own events go through (the handler sits on the root).
_GPTRM_LOGGER = "gptrm"

# Libraries whose INFO is chatter: they log at WARNING and above unless the level is debug.
_QUIET_LIBRARIES = ("grpc",)


class _Handler(logging.StreamHandler[TextIO]):
    """The handler configure_logging puts on the root logger (a later call replaces it)."""


def _component_from_logger_name(logger: WrappedLogger, method: str, event: EventDict) -> EventDict:
    """A library's line names its logger (``grpc._server``, ``etcd3.watch``) in ``component``."""
    record = event.get("_record")
    if "component" not in event and record is not None:
        event["component"] = record.name
    return event


def configure_logging(level: str = "info", *, json: bool | None = None, stream: TextIO | None = None,
                      once: bool = False) -> None:
    """Configure structlog and the standard library's logging for this process.

    :param level: minimum level name (debug, info, warning, error); lines below it are dropped,
        whether gptrm's own or a library's.
    :param json: force JSON (True) or console (False); None picks by whether ``stream`` is a TTY.
    :param stream: where log lines go (default stderr, so stdout stays free for program output).
    :param once: the process configures logging this once, before it logs (a daemon's ``main``): each logger
        keeps what it assembled at its first line, so a line below the level costs a method call, not an
        assembly. Left False where the configuration may change later (tests, log capture).
    """
    out = stream or sys.stderr
    if json is None:
        json = not out.isatty()
    renderer: Processor
    if json:
        renderer = structlog.processors.JSONRenderer(sort_keys=True)
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=out.isatty())
    threshold = _LEVELS.get(level, logging.INFO)
    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[
            *shared,
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(threshold),
        logger_factory=structlog.stdlib.LoggerFactory(),
        cache_logger_on_first_use=once,
    )
    handler = _Handler(out)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*shared, _component_from_logger_name],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
    ))
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _Handler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(threshold)
    for name in _QUIET_LIBRARIES:
        logging.getLogger(name).setLevel(threshold if threshold <= logging.DEBUG else max(threshold, logging.WARNING))
    # gptrm's own events are filtered by structlog already; the root's level does not apply twice.
    logging.getLogger(_GPTRM_LOGGER).setLevel(logging.DEBUG)


def get_logger(component: str) -> structlog.typing.FilteringBoundLogger:
    """A logger bound to ``component`` (``agent``, ``coordinator``, ...).

    The logger is assembled when first used, so one made at import time, before
    :func:`configure_logging`, still follows the configuration.
    """
    logger: structlog.typing.FilteringBoundLogger = structlog.get_logger(_GPTRM_LOGGER, component=component)
    return logger
