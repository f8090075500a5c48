"""A node's data-plane address and task port range: defaults and checks shared by agent and coordinator."""

from __future__ import annotations

import contextlib
import ipaddress
import socket

__all__ = ["MAX_ADDRESS", "address_problem", "parse_port_range", "port_range_problem", "primary_address"]

MAX_ADDRESS = 253
"""Longest address (a DNS name) a node may advertise."""
MIN_TASK_PORT = 1024


def primary_address() -> str:
    """This host's primary address: the source address of its default route (no packet is sent);
    127.0.0.1 when it has none."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.1", 9))   # TEST-NET-1: routing only, nothing is sent
        addr = s.getsockname()[0]
        if addr and addr != "0.0.0.0":
            return str(addr)
    return "127.0.0.1"


def address_problem(value: str) -> str | None:
    """Why ``value`` is no usable address (an IP literal or a DNS name); None when it is."""
    if not value or len(value) > MAX_ADDRESS:
        return f"expected an IP address or host name of 1..{MAX_ADDRESS} characters, got {value[:80]!r}"
    with contextlib.suppress(ValueError):
        ipaddress.ip_address(value)
        return None
    labels = value.rstrip(".").split(".")
    if all(0 < len(label) <= 63 and all(c.isascii() and (c.isalnum() or c == "-") for c in label)
           and not label.startswith("-") and not label.endswith("-") for label in labels):
        return None
    return f"expected an IP address or host name, got {value[:80]!r}"


def parse_port_range(value: str) -> tuple[int, int]:
    """``LOW-HIGH`` as two ints.

    :raises ValueError: naming what is wrong (not two numbers, below 1024, above 65535, LOW > HIGH).
    """
    low, sep, high = value.strip().partition("-")
    if not sep or not low.strip().isdigit() or not high.strip().isdigit():
        raise ValueError(f"expected LOW-HIGH (e.g. 29500-29999), got {value!r}")
    lo, hi = int(low), int(high)
    problem = port_range_problem(lo, hi)
    if problem:
        raise ValueError(problem)
    return lo, hi


def port_range_problem(low: int, high: int) -> str | None:
    """Why ``low..high`` is no usable task port range; None when it is."""
    if not MIN_TASK_PORT <= low <= high <= 65535:
        return f"expected {MIN_TASK_PORT} <= LOW <= HIGH <= 65535, got {low}-{high}"
    return None
