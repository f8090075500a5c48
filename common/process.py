"""The ``main()`` shape shared by gptrm's long-running processes."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from common.errors import GptrmError
from common.logging import configure_logging

__all__ = ["run_service"]


def run_service(prog: str, load: Callable[[Sequence[str] | None], Any],
                serve: Callable[[Any, asyncio.Event], Awaitable[None]], argv: Sequence[str] | None) -> int:
    """Load the config, set up logging, serve until SIGTERM/SIGINT; errors are one line on stderr.

    :param prog: program name for error lines.
    :param load: builds the frozen config from ``argv`` (raises ConfigError).
    :param serve: runs the process until the event it is given is set.
    :returns: 0 on a clean stop, 2 on a configuration error, 1 on any other gptrm error.
    """
    try:
        cfg = load(argv)
    except GptrmError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    configure_logging(cfg.log_level, once=True)

    async def go() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve(cfg, stop)

    try:
        asyncio.run(go())
    except GptrmError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 1
    return 0
