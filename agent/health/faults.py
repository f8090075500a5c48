"""Faults injected into simulated GPUs: ``gptrm-agent --simulate-faults FILE``.

The file holds one JSON object per line, each naming a GPU and one or more faults::

    {"gpu": 3, "xid": 79}                 an XID event (classified like a real one)
    {"gpu": 1, "throttle": "thermal"}     clocks held back (at half): thermal, hardware, power_brake; null clears
    {"gpu": 0, "nvlink_down": 2}          NVLink 2 goes down ({"nvlink_up": 2} brings it back)
    {"gpu": 2, "ecc_dbe": 1}              that many double-bit errors on the volatile ECC counter
    {"gpu": 2, "row_remap": "pending"}    a row remap pending ("failed": it failed; null clears)
    {"gpu": 2, "pcie_width": 8}           the PCIe link trained at x8 (null: full width again)
    {"gpu": 2, "lost": true}              the GPU falls off the bus (stops answering)
    {"gpu": 2, "reset": true}             a GPU reset: clears the volatile ECC count, a pending
                                          remap, downed NVLinks and reset-kind XIDs

The lines present when the agent starts are applied at its first tick, and lines appended later at the
tick after they are written (the file is followed like ``tail -f``; a file replaced by a shorter one is
read from its start). A bad line is logged (``simulated_fault_skipped``, naming the line and the field)
and skipped; it never stops the agent. Lines longer than :data:`MAX_LINE_BYTES` are skipped, at most
:data:`MAX_READ_BYTES` are read per tick, and the file is followed up to :data:`MAX_FILE_BYTES`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from agent.health.classify import CLOCKS_HW_POWER_BRAKE, CLOCKS_HW_SLOWDOWN, CLOCKS_HW_THERMAL, MAX_XID
from agent.health.readings import GpuSignals
from common.errors import ValidationError

__all__ = [
    "MAX_FILE_BYTES",
    "MAX_LINE_BYTES",
    "MAX_READ_BYTES",
    "THROTTLES",
    "FaultFile",
    "SimFaults",
    "parse_fault",
]

MAX_LINE_BYTES = 1024
MAX_READ_BYTES = 64 * 1024
MAX_FILE_BYTES = 16 * 1024 * 1024
THROTTLES = {"thermal": CLOCKS_HW_THERMAL | CLOCKS_HW_SLOWDOWN, "hardware": CLOCKS_HW_SLOWDOWN,
             "power_brake": CLOCKS_HW_POWER_BRAKE | CLOCKS_HW_SLOWDOWN}
_PCIE_WIDTH_MAX = 16
_PCIE_GEN = 5
_NVLINKS = 18
_KEYS = ("gpu", "xid", "throttle", "nvlink_down", "nvlink_up", "ecc_dbe", "row_remap", "pcie_width", "lost", "reset")

Log = structlog.typing.FilteringBoundLogger


def _int(value: Any, name: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValidationError(name, f"{str(value)[:32]!r} is not a whole number in {low}..{high}")
    return value


def _choice(value: Any, name: str, choices: Sequence[str]) -> str | None:
    if value is not None and value not in choices:
        raise ValidationError(name, f"{str(value)[:32]!r} is not one of {', '.join(choices)} or null")
    return value


def _flag(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise ValidationError(name, f"{str(value)[:32]!r} is not true or false")
    return value


def parse_fault(line: str, gpu_count: int) -> dict[str, Any]:
    """One line of the file as ``{field: value}``, every field checked (nothing applied yet).

    :raises ValidationError: naming the field (``gpu``, ``xid``, ...) and what is wrong with it.
    """
    try:
        obj = json.loads(line)
    except ValueError as e:
        raise ValidationError("line", f"not JSON: {e}") from None
    if not isinstance(obj, dict):
        raise ValidationError("line", "not a JSON object")
    unknown = sorted(set(obj) - set(_KEYS))
    if unknown:
        raise ValidationError(unknown[0][:32], f"unknown field; expected {', '.join(_KEYS)}")
    if "gpu" not in obj:
        raise ValidationError("gpu", "missing: which GPU the fault is on")
    if len(obj) < 2:
        raise ValidationError("line", "names no fault")
    out: dict[str, Any] = {"gpu": _int(obj["gpu"], "gpu", 0, gpu_count - 1)}
    for name, value in obj.items():
        if name in ("xid",):
            out[name] = _int(value, name, 1, MAX_XID)
        elif name in ("nvlink_down", "nvlink_up"):
            out[name] = _int(value, name, 0, _NVLINKS - 1)
        elif name == "ecc_dbe":
            out[name] = _int(value, name, 0, 1 << 20)
        elif name == "pcie_width":
            out[name] = None if value is None else _int(value, name, 1, _PCIE_WIDTH_MAX)
        elif name == "throttle":
            out[name] = _choice(value, name, tuple(THROTTLES))
        elif name == "row_remap":
            out[name] = _choice(value, name, ("pending", "failed"))
        elif name in ("lost", "reset"):
            out[name] = _flag(value, name)
    return out


@dataclass(slots=True)
class _GpuFaults:
    xids: list[int] = field(default_factory=list)
    throttle: str | None = None
    nvlinks_down: set[int] = field(default_factory=set)
    ecc_dbe: int = 0
    row_remap: str | None = None
    pcie_width: int | None = None
    lost: str = ""
    reset: bool = False


class SimFaults:
    """The faults each simulated GPU has now, and the signals they read as.

    :param gpu_count: GPUs. :param source: the file to follow (None: faults only through :meth:`apply`).
    """

    def __init__(self, gpu_count: int, source: FaultFile | None = None) -> None:
        self._gpus = [_GpuFaults() for _ in range(gpu_count)]
        self._source = source

    def poll(self) -> None:
        """Apply the lines appended to the file since the last poll."""
        if self._source is not None:
            for fault in self._source.read(len(self._gpus)):
                self.apply(fault)

    def apply(self, fault: dict[str, Any]) -> None:
        """Apply one parsed fault (:func:`parse_fault`)."""
        gpu = self._gpus[fault["gpu"]]
        if fault.get("reset"):
            gpu.reset = True
            gpu.ecc_dbe = 0
            gpu.nvlinks_down.clear()
            if gpu.row_remap == "pending":
                gpu.row_remap = None
        if "xid" in fault:
            gpu.xids.append(fault["xid"])
        if "throttle" in fault:
            gpu.throttle = fault["throttle"]
        if "nvlink_down" in fault:
            gpu.nvlinks_down.add(fault["nvlink_down"])
        if "nvlink_up" in fault:
            gpu.nvlinks_down.discard(fault["nvlink_up"])
        gpu.ecc_dbe += fault.get("ecc_dbe", 0)
        if "row_remap" in fault:
            gpu.row_remap = fault["row_remap"]
        if "pcie_width" in fault:
            gpu.pcie_width = fault["pcie_width"]
        if "lost" in fault:
            gpu.lost = "gpu_is_lost" if fault["lost"] else ""

    def set_lost(self, index: int, evidence: str) -> None:
        """GPU ``index`` stops answering (``evidence`` says why) or, with "", answers again."""
        self._gpus[index].lost = evidence

    def throttled(self, index: int) -> bool:
        """Whether GPU ``index``'s clocks are held back (``throttle``)."""
        return self._gpus[index].throttle is not None

    def lost(self, index: int) -> bool:
        """Whether GPU ``index`` no longer answers."""
        return bool(self._gpus[index].lost)

    def signals(self, index: int, now_unix_s: float, *, busy: bool) -> GpuSignals:
        """GPU ``index``'s signals this tick; its XID events and reset are handed over once."""
        gpu = self._gpus[index]
        xids = tuple((x, now_unix_s) for x in gpu.xids)
        reset, gpu.xids, gpu.reset = gpu.reset, [], False
        if gpu.lost:
            return GpuSignals(lost=gpu.lost, xids=xids, reset_seen=reset)
        return GpuSignals(
            xids=xids, reset_seen=reset,
            ecc_uncorrected_volatile=gpu.ecc_dbe, ecc_corrected_volatile=0,
            remapped_correctable=0, remapped_uncorrectable=1 if gpu.row_remap else 0,
            remap_pending=gpu.row_remap == "pending", remap_failure=gpu.row_remap == "failed",
            clocks_event_reasons=THROTTLES[gpu.throttle] if gpu.throttle else 0,
            pcie_gen=_PCIE_GEN, pcie_gen_max=_PCIE_GEN, pcie_width=gpu.pcie_width or _PCIE_WIDTH_MAX,
            pcie_width_max=_PCIE_WIDTH_MAX, busy=busy, nvlinks_down=tuple(sorted(gpu.nvlinks_down)),
        )


class FaultFile:
    """``--simulate-faults FILE``, followed from its start: each :meth:`read` returns the complete lines
    written since the last, parsed; bad ones are logged and skipped.

    :param path: the file (it may appear later; its absence is logged once). :param log: for bad lines.
    """

    def __init__(self, path: str | Path, log: Log) -> None:
        self._path = Path(path)
        self._log = log.bind(path=str(self._path))
        self._offset = 0
        self._line_no = 0
        self._partial = b""
        self._skipping = False     # inside a line longer than MAX_LINE_BYTES
        self._missing_logged = False
        self._full_logged = False

    def read(self, gpu_count: int) -> list[dict[str, Any]]:
        """The faults of the complete lines appended since the last read."""
        try:
            with open(self._path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < self._offset:   # replaced or truncated: start over
                    self._log.info("simulated_faults_file_restarted", size=size)
                    self._offset, self._line_no, self._partial, self._skipping = 0, 0, b"", False
                if self._offset >= MAX_FILE_BYTES:
                    if not self._full_logged:
                        self._full_logged = True
                        self._log.warning("simulated_faults_file_too_big", limit_bytes=MAX_FILE_BYTES)
                    return []
                f.seek(self._offset)
                chunk = f.read(min(MAX_READ_BYTES, MAX_FILE_BYTES - self._offset))
        except FileNotFoundError:
            if not self._missing_logged:
                self._missing_logged = True
                self._log.warning("simulated_faults_file_missing", reason="no such file yet; watching for it")
            return []
        except OSError as e:
            self._log.warning("simulated_faults_file_unreadable", reason=str(e))
            return []
        self._missing_logged = False
        self._offset += len(chunk)
        faults = []
        data = self._partial + chunk
        *lines, self._partial = data.split(b"\n")
        for raw in lines:
            self._line_no += 1
            if self._skipping:
                self._skipping = False
                continue
            fault = self._parse(raw, gpu_count)
            if fault is not None:
                faults.append(fault)
        if len(self._partial) > MAX_LINE_BYTES and not self._skipping:
            # The rest of the line is skipped (and counted) when its newline arrives.
            self._skip(self._line_no + 1, "line", f"longer than {MAX_LINE_BYTES} bytes")
            self._skipping = True
        if self._skipping:
            self._partial = b""
        return faults

    def _parse(self, raw: bytes, gpu_count: int) -> dict[str, Any] | None:
        line = raw.decode(errors="replace").strip()
        if not line:
            return None
        if len(raw) > MAX_LINE_BYTES:
            self._skip(self._line_no, "line", f"longer than {MAX_LINE_BYTES} bytes")
            return None
        try:
            fault = parse_fault(line, gpu_count)
        except ValidationError as e:
            self._skip(self._line_no, e.field, e.problem)
            return None
        self._log.info("simulated_fault_applied", line=self._line_no, **{k: v for k, v in fault.items()})
        return fault

    def _skip(self, line_no: int, field_name: str, problem: str) -> None:
        self._log.warning("simulated_fault_skipped", line=line_no, field=field_name, reason=problem)
