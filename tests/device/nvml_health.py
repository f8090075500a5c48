"""Every NVML call behind the agent's GPU health signals, on a real GPU: its result and its cost.

A manual check on a GPU host, not part of ``make test``::

    python3 tests/device/nvml_health.py [--out DIR] [--gpu 0] [--events-seconds 3]

Prints one JSON line per call (and writes them to ``DIR/nvml_health.jsonl`` with ``--out``): the
call, its result or its error (NotSupported shows which signals this GPU lacks), and its CPU and wall
time per call over 20 calls. Then it registers the GPU for XID (and double-bit ECC) events, waits in
``nvmlEventSetWait_v2`` for ``--events-seconds`` (a healthy GPU times out: NVMLError_Timeout) and
reports the CPU the waiting thread used (about none: the wait blocks inside NVML). Last, the
collector itself (:func:`agent.collectors.nvml.open_nvml`, health watching on): what a tick costs with
and without the slow signals due, and the health it classifies each GPU in.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

REPEAT = 20


def _plain(value: Any) -> Any:
    """A result as JSON can hold it (ctypes structs as their fields)."""
    if isinstance(value, (int, float, str, bool)) or value is None:
        return value
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value][:16]
    fields = getattr(value, "_fields_", None)
    if fields:
        return {name: _plain(getattr(value, name)) for name, *_ in fields}
    return repr(value)[:200]


def timed(name: str, call: Callable[[], Any], out: list[dict[str, Any]]) -> Any:
    """Call ``call`` REPEAT times; record its first result (or error) and its cost per call."""
    cpu0, wall0 = time.process_time(), time.perf_counter()
    result: Any = None
    error = ""
    for _ in range(REPEAT):
        try:
            result = call()
        except Exception as e:   # record and go on: NotSupported is an answer here
            error = f"{type(e).__name__}: {e}"
            break
    calls = 1 if error else REPEAT
    line = {"call": name, "cpu_us_per_call": round((time.process_time() - cpu0) * 1e6 / calls, 1),
            "wall_us_per_call": round((time.perf_counter() - wall0) * 1e6 / calls, 1)}
    line.update({"error": error} if error else {"result": _plain(result)})
    print(json.dumps(line), flush=True)
    out.append(line)
    return None if error else result


def events(pynvml: Any, handle: Any, seconds: float, out: list[dict[str, Any]]) -> None:
    """Register for XID and double-bit ECC events and wait in a thread for ``seconds``; its CPU use."""
    event_set = timed("nvmlEventSetCreate", pynvml.nvmlEventSetCreate, out)
    if event_set is None:
        return
    supported = timed("nvmlDeviceGetSupportedEventTypes", lambda: pynvml.nvmlDeviceGetSupportedEventTypes(handle),
                      out) or 0
    wanted = (pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError) & supported
    try:
        pynvml.nvmlDeviceRegisterEvents(handle, wanted, event_set)
        registered = {"call": "nvmlDeviceRegisterEvents", "result": hex(wanted)}
    except pynvml.NVMLError as e:
        registered = {"call": "nvmlDeviceRegisterEvents", "error": str(e)}
    print(json.dumps(registered), flush=True)
    out.append(registered)
    waits: list[str] = []

    def wait() -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                data = pynvml.nvmlEventSetWait_v2(event_set, 1000)
                waits.append(f"event type={data.eventType:#x} data={data.eventData}")
            except pynvml.NVMLError as e:
                waits.append(f"{type(e).__name__}")

    cpu0, wall0 = time.process_time(), time.perf_counter()
    thread = threading.Thread(target=wait)
    thread.start()
    thread.join()
    line = {"call": "nvmlEventSetWait_v2 (1000 ms each)", "seconds": round(time.perf_counter() - wall0, 2),
            "cpu_ms_total": round((time.process_time() - cpu0) * 1000, 2), "results": waits[:10]}
    print(json.dumps(line), flush=True)
    out.append(line)
    timed("nvmlEventSetFree", lambda: pynvml.nvmlEventSetFree(event_set), out)


def collector(out: list[dict[str, Any]]) -> None:
    """The agent's collector with health watching: a tick with the slow signals due, and without."""
    from agent.collectors.nvml import open_nvml
    from agent.health import HealthOptions
    from common.logging import get_logger

    gpus = open_nvml(get_logger("probe"), health=HealthOptions(read_s=0.0))
    try:
        for label, read_s in (("tick, slow signals every tick", 0.0), ("tick, slow signals not due", 3600.0)):
            if gpus._watcher is not None:
                gpus._watcher._read_s = read_s
            gpus.collect()
            cpu0 = time.process_time()
            readings = [gpus.collect() for _ in range(REPEAT)][-1]
            line = {"call": f"collector {label}", "gpus": len(readings),
                    "cpu_ms_per_tick": round((time.process_time() - cpu0) * 1000 / REPEAT, 3),
                    "health": [{"gpu": r.index, "state": r.health.state if r.health else "",
                                "reason": r.health.reason if r.health else "",
                                "evidence": r.health.evidence if r.health else ""} for r in readings]}
            print(json.dumps(line), flush=True)
            out.append(line)
    finally:
        gpus.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="also write the lines to DIR/nvml_health.jsonl")
    parser.add_argument("--gpu", type=int, default=0, help="the GPU to probe")
    parser.add_argument("--events-seconds", type=float, default=3.0, help="how long to wait for XID events")
    args = parser.parse_args()
    import pynvml

    out: list[dict[str, Any]] = []
    pynvml.nvmlInit()
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(args.gpu)
        timed("nvmlDeviceGetName", lambda: pynvml.nvmlDeviceGetName(h), out)
        timed("nvmlDeviceGetTotalEccErrors(uncorrected, volatile)", lambda: pynvml.nvmlDeviceGetTotalEccErrors(
            h, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC), out)
        timed("nvmlDeviceGetTotalEccErrors(corrected, volatile)", lambda: pynvml.nvmlDeviceGetTotalEccErrors(
            h, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC), out)
        timed("nvmlDeviceGetRemappedRows", lambda: pynvml.nvmlDeviceGetRemappedRows(h), out)
        timed("nvmlDeviceGetRetiredPagesPendingStatus", lambda: pynvml.nvmlDeviceGetRetiredPagesPendingStatus(h), out)
        timed("nvmlDeviceGetRetiredPages(double-bit)", lambda: pynvml.nvmlDeviceGetRetiredPages(
            h, pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR), out)
        timed("nvmlDeviceGetCurrentClocksEventReasons", lambda: pynvml.nvmlDeviceGetCurrentClocksEventReasons(h), out)
        timed("nvmlDeviceGetCurrentClocksThrottleReasons",
              lambda: pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h), out)
        for name in ("nvmlDeviceGetCurrPcieLinkGeneration", "nvmlDeviceGetMaxPcieLinkGeneration",
                     "nvmlDeviceGetCurrPcieLinkWidth", "nvmlDeviceGetMaxPcieLinkWidth"):
            timed(name, lambda name=name: getattr(pynvml, name)(h), out)
        states = []
        for link in range(int(pynvml.NVML_NVLINK_MAX_LINKS)):
            try:
                states.append(int(pynvml.nvmlDeviceGetNvLinkState(h, link)))
            except pynvml.NVMLError as e:
                states.append(type(e).__name__)  # type: ignore[arg-type]
        line = {"call": "nvmlDeviceGetNvLinkState per link", "result": states}
        print(json.dumps(line), flush=True)
        out.append(line)
        timed("nvmlDeviceGetNvLinkState(link 0)", lambda: pynvml.nvmlDeviceGetNvLinkState(h, 0), out)
        events(pynvml, h, args.events_seconds, out)
    finally:
        pynvml.nvmlShutdown()
    collector(out)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "nvml_health.jsonl").write_text("".join(json.dumps(line) + "\n" for line in out))


if __name__ == "__main__":
    main()
