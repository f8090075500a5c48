"""One log stream: what grpc, etcd3 and asyncio log through the standard library comes out the way gptrm's
own events do (JSON lines with the same keys, the contextvars bound, the configured level)."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

from common.logging import configure_logging, get_logger


@pytest.fixture
def out() -> Iterator[io.StringIO]:
    """configure_logging as the coordinator calls it (level info), JSON lines into a buffer."""
    buf = io.StringIO()
    configure_logging("info", json=True, stream=buf)
    structlog.contextvars.clear_contextvars()
    yield buf
    structlog.contextvars.clear_contextvars()


def _lines(buf: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in buf.getvalue().splitlines()]


def test_library_lines_carry_gptrm_keys_and_bound_context(out: io.StringIO) -> None:
    structlog.contextvars.bind_contextvars(request_id="r-1")
    get_logger("coordinator").warning("lease_lost", node_id="n1")
    logging.getLogger("grpc").warning("channel closed")
    logging.getLogger("etcd3").warning("watch %s failed", "w1")
    logging.getLogger("asyncio").error("task exception was never retrieved")
    own, grpc_line, etcd_line, asyncio_line = _lines(out)
    assert own == {"component": "coordinator", "event": "lease_lost", "level": "warning", "node_id": "n1",
                   "request_id": "r-1", "timestamp": own["timestamp"]}
    keys = set(own) - {"node_id"}
    for line in (grpc_line, etcd_line, asyncio_line):
        assert set(line) == keys, line
        assert line["request_id"] == "r-1"
    assert (grpc_line["component"], grpc_line["event"], grpc_line["level"]) == ("grpc", "channel closed", "warning")
    assert (etcd_line["component"], etcd_line["event"]) == ("etcd3", "watch w1 failed")
    assert (asyncio_line["component"], asyncio_line["level"]) == ("asyncio", "error")


def test_the_level_applies_to_library_lines_and_grpc_chatter_stays_quiet(out: io.StringIO) -> None:
    logging.getLogger("etcd3").debug("below the level")
    logging.getLogger("grpc._server").info("grpc chatter")
    get_logger("coordinator").debug("below_the_level")
    logging.getLogger("etcd3").info("shown")
    assert [line["event"] for line in _lines(out)] == ["shown"]


def test_a_library_traceback_is_one_json_line(out: io.StringIO) -> None:
    try:
        raise ValueError("bad")
    except ValueError:
        logging.getLogger("asyncio").exception("callback failed")
    [line] = _lines(out)
    assert line["event"] == "callback failed"
    assert "ValueError: bad" in line["exception"]


def test_a_logger_made_before_configuration_follows_it() -> None:
    early = get_logger("admin")
    buf = io.StringIO()
    configure_logging("info", json=True, stream=buf)
    early.info("admin_ready")
    [line] = _lines(buf)
    assert (line["component"], line["event"]) == ("admin", "admin_ready")


def test_configuring_again_replaces_the_handler() -> None:
    first, second = io.StringIO(), io.StringIO()
    configure_logging("info", json=True, stream=first)
    configure_logging("info", json=True, stream=second)
    logging.getLogger("grpc").warning("once")
    assert first.getvalue() == ""
    assert [line["event"] for line in _lines(second)] == ["once"]


def test_configured_once_a_logger_keeps_what_it_assembled_at_its_first_line() -> None:
    """A daemon configures once (``once=True``): a line below the level is dropped, and each logger keeps the
    filtering it assembled at its first line. Run in its own process: the kept loggers would outlive this test."""
    code = """
import io, json, sys
from common.logging import configure_logging, get_logger
buf = io.StringIO()
configure_logging("warning", json=True, stream=buf, once=True)
kept = get_logger("admin")
kept.info("below")
kept.warning("above")
configure_logging("info", json=True, stream=buf)
kept.info("still_below")
get_logger("fresh").info("fresh_info")
print(json.dumps([json.loads(l)["event"] for l in buf.getvalue().splitlines()]))
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).resolve().parents[3])
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == ["above", "fresh_info"]
