"""Which NVML call costs the agent's process what memory: a manual check on a GPU host.

    python3 tests/device/nvml_footprint.py [--init-flags]

Runs, in this process, the steps the agent's NVML collector takes (``nvmlInit``, the handles,
the inventory and topology reads of :func:`agent.collectors.nvml.open_nvml`, then each field of
a tick once) and prints after each step the RSS, the anonymous part, and which NVIDIA libraries
are mapped (``libcuda`` loaded by a call shows here). ``--init-flags`` compares ``nvmlInitWithFlags``'s
flags instead, each in a process of its own.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def state() -> dict[str, object]:
    """RSS, anonymous RSS (MB) and the NVIDIA/CUDA libraries mapped now."""
    mem = psutil.Process().memory_info()
    libs = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            name = line.rsplit("/", 1)[-1].strip()
            if name.startswith(("libcuda", "libnvidia")):
                libs.add(name)
    return {"rss_mb": round(mem.rss / 1e6, 1), "anon_mb": round((mem.rss - mem.shared) / 1e6, 1),
            "libs": sorted(libs)}


def init_flags() -> None:
    """Each ``nvmlInitWithFlags`` flag in a process of its own: what it maps and costs, and whether a
    tick's reads still work after it."""
    import subprocess

    for flag in ("0", "NVML_INIT_FLAG_NO_ATTACH", "NVML_INIT_FLAG_NO_GPUS"):
        code = (f"import sys, json; sys.path.insert(0, {str(Path(__file__).resolve().parent)!r}); "
                "import nvml_footprint as f, pynvml; before = f.state(); "
                f"pynvml.nvmlInitWithFlags({flag if flag == '0' else 'pynvml.' + flag}); after = f.state(); "
                "h = pynvml.nvmlDeviceGetHandleByIndex(0); ok = {}\n"
                "for name in ('nvmlDeviceGetUtilizationRates', 'nvmlDeviceGetPowerUsage', 'nvmlDeviceGetMemoryInfo', "
                "'nvmlDeviceGetComputeRunningProcesses', 'nvmlDeviceGetEnforcedPowerLimit'):\n"
                "    try: getattr(pynvml, name)(h); ok[name] = 'ok'\n"
                "    except Exception as e: ok[name] = str(e)\n"
                "print(json.dumps({'flag': %r, 'before': before, 'after_init': after, 'after_reads': f.state(), "
                "'reads': ok}))" % flag)
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        print(done.stdout.strip() or done.stderr.strip()[-800:], flush=True)


def main() -> None:
    """Print one JSON line per step."""
    import pynvml

    from agent.collectors import nvml as collector
    from common.logging import get_logger

    def step(name: str, call: object) -> None:
        started = time.process_time()
        try:
            result = call() if callable(call) else None
            error = ""
        except Exception as e:   # record and go on
            result, error = None, f"{type(e).__name__}: {e}"
        print(json.dumps({"step": name, "cpu_ms": round((time.process_time() - started) * 1000, 2),
                          **state(), **({"error": error} if error else {})}), flush=True)
        return result

    step("imported", None)
    step("nvmlInit", pynvml.nvmlInit)
    handles = step("handles", lambda: [pynvml.nvmlDeviceGetHandleByIndex(i)
                                       for i in range(pynvml.nvmlDeviceGetCount())])
    devices = step("inventory", lambda: collector._read_inventory(pynvml, handles))
    step("topology", lambda: collector.read_topology(pynvml, handles, [d.pci_bus_id for d in devices],
                                                     get_logger("probe")))
    for field, call in collector._FIELDS.items():
        step(field, lambda call=call: call(pynvml, handles[0]))
    step("energy again", lambda: collector._FIELDS["energy"](pynvml, handles[0]))
    for name, call in (
        ("energy counter", lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(handles[0])),
        ("energy field value", lambda: pynvml.nvmlDeviceGetFieldValues(
            handles[0], [pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION])[0].value.ullVal),
        ("power usage", lambda: pynvml.nvmlDeviceGetPowerUsage(handles[0])),
    ):
        started = time.process_time()
        values = [call() for _ in range(20)]
        print(json.dumps({"timed": name, "cpu_ms_per_call": round((time.process_time() - started) * 50, 3),
                          "first": values[0], "last": values[-1]}), flush=True)
    step("nvmlShutdown", pynvml.nvmlShutdown)


if __name__ == "__main__":
    if sys.argv[1:] == ["--init-flags"]:
        init_flags()
    else:
        main()
