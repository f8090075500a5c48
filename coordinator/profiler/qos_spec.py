"""The QoS part of a task spec: checkpoint signal, deadline, metrics endpoint and mapping.

Parsing helpers used by ``gptrmctl`` and the YAML/JSON spec parser (deadlines written as an
ISO 8601 time or a duration, signal names) and :func:`validate_qos_spec`, which
:func:`coordinator.profiler.validation.validate_spec` calls at submit.
"""

from __future__ import annotations

import math
import re
import signal
from datetime import datetime

from common.errors import ValidationError
from common.pb.gptrm.v1 import types_pb2
from common.qos import FLAVOURS, ROLES, metric_name_problem, metrics_url_for_port, metrics_url_problem
from coordinator.run_limits import MAX_TIME_LIMIT_S

__all__ = [
    "DEFAULT_CHECKPOINT_SIGNAL",
    "metrics_url_of",
    "parse_deadline",
    "parse_duration",
    "parse_signal",
    "parse_time_limit",
    "validate_qos_spec",
]

DEFAULT_CHECKPOINT_SIGNAL = "SIGUSR1"
"""Sent to a task before it is stopped for a preemption, unless its spec names another."""

_UNCATCHABLE = (signal.SIGKILL, signal.SIGSTOP)
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|d|h|m|s)")
_DURATION = re.compile(r"^(?:\d+(?:\.\d+)?(?:ms|d|h|m|s))+$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_MAX_DEADLINE_AHEAD_S = 10 * 365 * 86400.0
_CLOCK = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


def parse_signal(name: str) -> signal.Signals:
    """A signal from its name: ``SIGUSR1``, ``USR1`` or ``usr1``.

    :raises ValueError: for an unknown name, or SIGKILL/SIGSTOP (a task cannot catch them to checkpoint).
    """
    key = name.strip().upper()
    key = key if key.startswith("SIG") else f"SIG{key}"
    try:
        sig = signal.Signals[key]
    except KeyError:
        raise ValueError(f"unknown signal {name!r} (e.g. SIGUSR1, SIGUSR2, SIGINT, SIGTERM)") from None
    if sig in _UNCATCHABLE:
        raise ValueError(f"{sig.name} cannot be caught, so a task cannot checkpoint on it")
    return sig


def parse_duration(text: str) -> float:
    """Seconds in a duration such as ``90s``, ``2h30m``, ``1d``, ``500ms``.

    :raises ValueError: when ``text`` is not a sequence of NUMBER+UNIT parts (units ms, s, m, h, d).
    """
    compact = text.strip().lower()
    if not _DURATION.match(compact):
        raise ValueError(f"not a duration: {text!r} (e.g. 90s, 45m, 2h30m, 1d)")
    return sum(float(n) * _UNIT_S[u] for n, u in _DURATION_PART.findall(compact))


def parse_time_limit(value: str | float) -> float:
    """Seconds in a run-time limit, written as a duration (``90s``, ``4h``, ``2h30m``, ``1d``) or as Slurm
    writes one: ``MINUTES``, ``MINUTES:SECONDS``, ``HOURS:MINUTES:SECONDS``, ``DAYS-HOURS[:MINUTES[:SECONDS]]``
    (``1:30:00`` is an hour and a half, a bare ``30`` thirty minutes). A number (not text) is seconds.

    :raises ValueError: for anything else, a negative or non-finite number, or more than a year.
    """
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"expected a duration such as 4h, 90s or 1:30:00, got {value!r}")
    if isinstance(value, str):
        text = value.strip()
        m = _CLOCK.match(text)
        if m is None:
            seconds = parse_duration(text)
        else:
            days, first, second, third = m.groups()
            parts = [int(p) for p in (first, second, third) if p is not None]
            if days is not None:   # DAYS-HOURS[:MINUTES[:SECONDS]]
                hms = [*parts, 0, 0][:3]
                seconds = int(days) * 86400.0 + hms[0] * 3600.0 + hms[1] * 60.0 + hms[2]
            elif len(parts) == 1:
                seconds = parts[0] * 60.0
            elif len(parts) == 2:
                seconds = parts[0] * 60.0 + parts[1]
            else:
                seconds = parts[0] * 3600.0 + parts[1] * 60.0 + parts[2]
    else:
        seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"not a duration ≥ 0: {value!r}")
    if seconds > MAX_TIME_LIMIT_S:
        raise ValueError(f"{value!r} is more than a year")
    return seconds


def parse_deadline(value: str | float, now: float) -> float:
    """A deadline as unix seconds, from an ISO 8601 time, a duration from ``now``, or unix seconds.

    An ISO time without a UTC offset is local time. The result is not checked against ``now``
    here (see :func:`validate_qos_spec`).

    :param value: ``"2025-06-01T18:00:00Z"``, ``"2h30m"``, or a number of unix seconds.
    :param now: unix seconds that a duration counts from.
    :raises ValueError: when the value is neither.
    """
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"expected an ISO 8601 time or a duration, got {value!r}")
    if not isinstance(value, str):
        return float(value)
    try:
        return now + parse_duration(value)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(value.strip()).timestamp()
    except (ValueError, OverflowError, OSError):
        raise ValueError(
            f"not a time or a duration: {value!r} (e.g. 2025-06-01T18:00:00Z or 2h30m)"
        ) from None


def metrics_url_of(spec: types_pb2.TaskSpec) -> str:
    """The endpoint the agent scrapes for a task: its ``metrics_url``, the URL its ``metrics_port``
    stands for, or "" when it declared neither."""
    if spec.metrics_url:
        return spec.metrics_url
    return metrics_url_for_port(spec.metrics_port) if spec.metrics_port else ""


def _validate_metrics(spec: types_pb2.TaskSpec) -> None:
    """The metrics endpoint (port or URL, not both) and the metric names."""
    if spec.metrics_port > 65535:
        raise ValidationError("spec.metrics_port", f"{spec.metrics_port} is not a port (1-65535)")
    if spec.metrics_url:
        if spec.metrics_port:
            raise ValidationError("spec.metrics_url", "give metrics_port or metrics_url, not both")
        problem = metrics_url_problem(spec.metrics_url)
        if problem is not None:
            raise ValidationError("spec.metrics_url", problem)
    mapping = spec.metrics_mapping
    if not spec.HasField("metrics_mapping"):
        return
    if not (spec.metrics_port or spec.metrics_url):
        raise ValidationError("spec.metrics_mapping", "names metrics but the spec has no metrics_port or metrics_url")
    if mapping.flavour and mapping.flavour not in FLAVOURS:
        raise ValidationError("spec.metrics_mapping.flavour",
                              f"unknown flavour {mapping.flavour!r} (one of {', '.join(FLAVOURS)})")
    named = [role for role in ROLES if getattr(mapping, role)]
    for role in named:
        problem = metric_name_problem(getattr(mapping, role))
        if problem is not None:
            raise ValidationError(f"spec.metrics_mapping.{role}", problem)
    if mapping.flavour == "custom" and not named:
        raise ValidationError("spec.metrics_mapping", f"flavour custom needs at least one of {', '.join(ROLES)}")


def validate_qos_spec(spec: types_pb2.TaskSpec, now: float) -> None:
    """Check the QoS fields of a spec at submit; the first problem found is raised.

    Refused: an unknown or uncatchable checkpoint signal; a deadline
    that has passed (or more than ten years ahead); a metrics port outside 1-65535; a metrics
    URL that is not plain http on a loopback address; both a port and a URL; a metrics
    mapping without an endpoint, with an unknown flavour or with invalid metric names.

    :param spec: the wire spec.
    :param now: unix seconds at submit.
    :raises ValidationError: naming the dotted field.
    """
    if spec.checkpoint_signal:
        try:
            parse_signal(spec.checkpoint_signal)
        except ValueError as e:
            raise ValidationError("spec.checkpoint_signal", str(e)) from None
    deadline = spec.qos.deadline_unix_s
    if deadline and math.isfinite(deadline):
        if deadline <= now:
            raise ValidationError("spec.qos.deadline_unix_s",
                                  f"{datetime.fromtimestamp(deadline).isoformat(timespec='seconds')} has passed")
        if deadline > now + _MAX_DEADLINE_AHEAD_S:
            raise ValidationError("spec.qos.deadline_unix_s", "is more than ten years ahead")
    _validate_metrics(spec)
