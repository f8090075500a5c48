"""Node providers: how the Resource Adaptor powers nodes off and on, or asks for new ones (the paper's
``createNewNode()``), behind one interface.

- ``static``: bare metal without remote power. Nothing can be switched; a scale-out becomes a
  recommendation (an event and the ``gptrm_adaptor_missing_resources`` gauge naming what is missing).
- ``command``: an operator's executable (an IPMI/Redfish or cloud CLI wrapper). Each request runs it
  once with one JSON object on stdin::

      {"action": "power_off" | "power_on" | "create", "node_id": "n1", "reason": "...", "demand": {...}}

  Exit status 0 means the request was accepted. Its stdout may be empty or one JSON object; anything
  else, a non-zero exit, or running past the timeout is a failure: an event names it, the caller
  leaves the node in its last safe state, and the same request is refused until a backoff (doubling
  per consecutive failure, capped) has passed.
- ``simulated``: the simulator's. It accepts every power request at once and completes it after a
  virtual delay (``boot_s`` for power-on, ``shutdown_s`` for power-off) on the simulator's clock;
  the simulator asks it which requests completed (:meth:`SimulatedProvider.completed`) and when the
  next one does (:meth:`SimulatedProvider.next_due`). ``create`` is refused: a replay's cluster is
  the trace's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from common.errors import ConfigError
from common.logging import get_logger
from coordinator.events import EventBus

__all__ = ["ACTIONS", "CommandProvider", "NodeProvider", "ProviderResult", "SimulatedProvider", "StaticProvider",
           "build_provider"]

ACTIONS = ("power_off", "power_on", "create")
_MAX_OUTPUT = 64 * 1024
"""Bytes of the command's stdout/stderr read; more is garbage."""


@dataclass(frozen=True, slots=True)
class ProviderResult:
    """What a provider answered.

    :param ok: the request was accepted.
    :param reason: why not (empty when accepted).
    :param attempted: False when it was not even tried (unsupported, or backing off).
    """

    ok: bool
    reason: str = ""
    attempted: bool = True


class NodeProvider(Protocol):
    """Powers nodes off and on, and asks for new ones."""

    name: str
    can_power: bool
    """Whether power_off/power_on can succeed at all (False: the adaptor never powers nodes down)."""
    can_create: bool
    """Whether ``create`` can bring a new node (False: it is at most a recommendation)."""

    async def request(self, action: str, node_id: str, reason: str,
                      demand: dict[str, float] | None = None) -> ProviderResult:
        """Ask for ``action`` on ``node_id`` (empty for ``create``)."""


class StaticProvider:
    """Bare metal without remote power: scale-outs become recommendations; nothing is switched.

    :param events: the cluster event log.
    :param missing: sets the ``gptrm_adaptor_missing_resources{resource}`` gauge (None: no metric).
    """

    name = "static"
    can_power = False
    can_create = False

    def __init__(self, events: EventBus, missing: Callable[[str, float], None] | None = None) -> None:
        self._events = events
        self._missing = missing
        self._log = get_logger("adaptor")

    async def request(self, action: str, node_id: str, reason: str,
                      demand: dict[str, float] | None = None) -> ProviderResult:
        """``create`` publishes a recommendation naming the missing resources; power actions are refused."""
        if action != "create":
            return ProviderResult(False, "the static provider cannot switch node power", attempted=False)
        demand = demand or {}
        what = ", ".join(f"{k}={v:g}" for k, v in sorted(demand.items())) or "unknown"
        # Event fields go to publish() as keywords; none of these is its node_id or task_id.
        missing: dict[str, Any] = {f"missing_{k}": v for k, v in demand.items()}
        self._events.publish("scale_out", f"recommendation: add a node with {what} ({reason})",
                             reason=reason, **missing)
        if self._missing is not None:
            for resource, amount in demand.items():
                self._missing(resource, amount)
        self._log.info("scale_out_recommended", reason=reason, missing=what)
        return ProviderResult(True)


class CommandProvider:
    """Runs an operator's executable per request (JSON on stdin, exit 0 = accepted).

    :param command: path of the executable.
    :param events: the cluster event log.
    :param timeout_s: how long one run may take before it is killed and counts as failed.
    :param backoff_s: first wait after a failure; doubles per consecutive failure.
    :param backoff_max_s: cap of the wait.
    :param now: monotonic clock (injected in tests).
    """

    name = "command"
    can_power = True
    can_create = True

    def __init__(self, command: str, events: EventBus, *, timeout_s: float = 60.0, backoff_s: float = 5.0,
                 backoff_max_s: float = 300.0, now: Callable[[], float] = time.monotonic) -> None:
        self._command, self._events = command, events
        self._timeout_s, self._backoff_s, self._backoff_max_s = timeout_s, backoff_s, backoff_max_s
        self._now = now
        self._failures: dict[tuple[str, str], tuple[int, float]] = {}   # (action, node) → (count, retry at)
        self._log = get_logger("adaptor")

    def retry_at(self, action: str, node_id: str) -> float | None:
        """When a failed request may be tried again (monotonic), or None when it is not backing off."""
        failed = self._failures.get((action, node_id))
        return failed[1] if failed else None

    async def request(self, action: str, node_id: str, reason: str,
                      demand: dict[str, float] | None = None) -> ProviderResult:
        """Run the command once for ``action`` (refused without running while backing off)."""
        if action not in ACTIONS:
            raise ValueError(f"unknown provider action {action!r}")
        key = (action, node_id)
        failed = self._failures.get(key)
        if failed is not None and self._now() < failed[1]:
            return ProviderResult(False, f"backing off after {failed[0]} failure(s)", attempted=False)
        payload = {"action": action, "node_id": node_id, "reason": reason, "demand": demand or {}}
        error = await self._run(json.dumps(payload).encode())
        log = self._log.bind(action=action, node_id=node_id)
        if error is None:
            self._failures.pop(key, None)
            log.info("node_provider_accepted", reason=reason)
            return ProviderResult(True)
        count = (failed[0] if failed else 0) + 1
        wait = min(self._backoff_max_s, self._backoff_s * 2 ** (count - 1))
        self._failures[key] = (count, self._now() + wait)
        log.warning("node_provider_failed", reason=error, failures=count, retry_in_s=wait)
        self._events.publish("power", f"node provider failed to {action} {node_id or 'a node'}: {error}; "
                             f"retrying in {wait:.0f}s", node_id=node_id, action=action, reason=error,
                             failures=count)
        return ProviderResult(False, error)

    async def _run(self, stdin: bytes) -> str | None:
        """Run the command; None when it accepted, else what went wrong."""
        try:
            proc = await asyncio.create_subprocess_exec(
                self._command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, start_new_session=True)
        except OSError as e:
            return f"cannot run {self._command}: {e.strerror or e}"
        try:
            out, err = await asyncio.wait_for(proc.communicate(stdin), self._timeout_s)
        except TimeoutError:
            _kill_group(proc)
            await proc.wait()
            return f"no answer within {self._timeout_s:g}s (killed)"
        except (BrokenPipeError, ConnectionResetError):
            out, err = b"", b""
            await proc.wait()
        if proc.returncode != 0:
            tail = err[-200:].decode(errors="replace").strip()
            return f"exit status {proc.returncode}" + (f": {tail}" if tail else "")
        return _check_output(out)


class SimulatedProvider:
    """The simulator's node provider: power changes complete after a virtual delay.

    A node is physically powered from the moment a power-on is accepted (it boots, drawing its
    idle power) until a power-off completes. ``completed(now)`` hands back the changes whose delay
    has passed, in completion order; the simulator then lets a booted node's agent register.

    :param now: the simulator's virtual clock.
    :param boot_s: virtual seconds from power-on until the node's agent registers.
    :param shutdown_s: virtual seconds from power-off until the node draws nothing.
    :raises ValueError: a negative delay.
    """

    name = "simulated"
    can_power = True
    can_create = False

    def __init__(self, now: Callable[[], float], *, boot_s: float = 0.0, shutdown_s: float = 0.0) -> None:
        if boot_s < 0 or shutdown_s < 0:
            raise ValueError(f"simulated provider delays must be ≥ 0, got boot_s={boot_s}, shutdown_s={shutdown_s}")
        self._now, self._boot_s, self._shutdown_s = now, boot_s, shutdown_s
        self._pending: dict[str, tuple[float, str]] = {}   # node → (completes at, action)
        self._off: set[str] = set()
        self.requests: list[tuple[float, str, str]] = []   # (time, action, node) accepted, for reports and tests

    def powered(self, node_id: str) -> bool:
        """Whether the node draws power (on, booting, or shutting down)."""
        return node_id not in self._off

    async def request(self, action: str, node_id: str, reason: str,
                      demand: dict[str, float] | None = None) -> ProviderResult:
        """Accept ``power_off``/``power_on`` (completing after the delay); refuse ``create``."""
        if action not in ACTIONS:
            raise ValueError(f"unknown provider action {action!r}")
        if action == "create":
            return ProviderResult(False, "the simulated cluster has a fixed set of nodes", attempted=False)
        now = self._now()
        self.requests.append((now, action, node_id))
        if action == "power_on":
            self._off.discard(node_id)
            self._pending[node_id] = (now + self._boot_s, action)
        else:
            self._pending[node_id] = (now + self._shutdown_s, action)
        return ProviderResult(True)

    def next_due(self) -> float | None:
        """When the next accepted change completes (None: none is in flight)."""
        return min((at for at, _ in self._pending.values()), default=None)

    def completed(self, now: float) -> list[tuple[str, str]]:
        """The changes complete by ``now``, as ``(action, node_id)`` in completion order; forgets them."""
        done = sorted((at, node_id, action) for node_id, (at, action) in self._pending.items() if at <= now)
        for _, node_id, action in done:
            del self._pending[node_id]
            if action == "power_off":
                self._off.add(node_id)
        return [(action, node_id) for _, node_id, action in done]


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):   # already gone
        os.killpg(proc.pid, signal.SIGKILL)


def _check_output(out: bytes) -> str | None:
    """Empty or one JSON object is fine; anything else is garbage."""
    text = out.strip()
    if not text:
        return None
    if len(text) > _MAX_OUTPUT:
        return f"output longer than {_MAX_OUTPUT} bytes"
    try:
        doc: Any = json.loads(text)
    except (ValueError, UnicodeDecodeError):
        return f"output is not JSON: {text[:80].decode(errors='replace')!r}"
    if not isinstance(doc, dict):
        return "output is JSON but not an object"
    return None


def build_provider(kind: str, command: str, events: EventBus, *, timeout_s: float,
                   missing: Callable[[str, float], None] | None = None) -> NodeProvider:
    """The provider named by ``--node-provider``.

    :raises ConfigError: ``command`` without an executable path.
    """
    if kind == "command":
        if not command:
            raise ConfigError("--node-provider-command: required with --node-provider command")
        return CommandProvider(command, events, timeout_s=timeout_s)
    if kind == "static":
        return StaticProvider(events, missing)
    raise ConfigError(f"--node-provider: expected static or command, got {kind!r}")
