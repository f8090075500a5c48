"""What the agent reads and does on a real NVIDIA GPU host: a manual check, not part of ``make test``.

Run it as root on a GPU host, with the agent's dependencies importable (an agent install, or
the wheels on ``PYTHONPATH``)::

    python3 tests/device/gpu_check.py --out DIR [--load-seconds 12] [--set-power-limit]

It writes ``DIR/gpu_check.json`` and ``DIR/metrics.txt`` and prints a summary:

1. the inventory and topology the agent registers (NVML through :func:`agent.collectors.nvml.open_nvml`);
2. the sampler's readings (:func:`agent.sampler.build_sampler`, backend ``nvml``) while idle and
   while a load runs on GPU 0 (a bf16 matrix product loop in PyTorch, when PyTorch is there),
   the load's process counted as a task's;
3. what each NVML field the collector reads costs per call, what a tick of the collector costs
   with the energy counter read every tick and as it is, and (``--set-power-limit`` only: it
   changes the GPU's setting for 3 s) a power limit set on GPU 0 through the collector, read
   back over 3 s, and the old one restored;
4. ``gptrm-agent --gpu-backend nvml --metrics-listen`` with no coordinator: its ``/metrics``
   (dcgm-exporter's names, the collector gauges) and its RSS beside its import floor.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

LOAD = """
import sys, time, torch
a = torch.randn(8192, 8192, device="cuda:0", dtype=torch.bfloat16)
print("ready", flush=True)
end = time.time() + float(sys.argv[1])
while time.time() < end:
    for _ in range(20):
        a @ a
    torch.cuda.synchronize()
"""
FLOOR = "import sys; sys.path.insert(0, {repo!r}); import agent.daemon; print('up', flush=True); sys.stdin.read()"


def inventory() -> dict[str, Any]:
    """Step 1: what the agent registers."""
    from agent.collectors.nvml import open_nvml
    from common.logging import configure_logging, get_logger

    configure_logging("info", json=True)
    gpus = open_nvml(get_logger("gpu_check"))
    try:
        return {"devices": [device_dict(d) for d in gpus.devices()]}
    finally:
        gpus.close()


def device_dict(device: Any) -> dict[str, Any]:
    """A GpuDevice as plain JSON."""
    import dataclasses

    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(device).items()}


def readings(load_seconds: float, set_power_limit: bool) -> dict[str, Any]:
    """Steps 2 and 3: samples idle and under load, and (when asked) a power limit set and restored."""
    from google.protobuf.json_format import MessageToDict

    from agent.sampler import build_sampler
    from common.logging import get_logger

    load: subprocess.Popen[str] | None = None
    pids: dict[str, list[int]] = {}
    sampler = build_sampler(node_id="gpu-check", gpu_backend="nvml", simulate_spec="", interval_s=1.0,
                            log=get_logger("gpu_check"), data_paths=["/"], task_pids=lambda: pids)
    out: dict[str, Any] = {}
    try:
        out["idle"] = MessageToDict(sampler.sample_once())
        try:
            load = subprocess.Popen([sys.executable, "-c", LOAD, str(load_seconds)], stdout=subprocess.PIPE, text=True)
            assert load.stdout is not None
            out["load_started"] = load.stdout.readline().strip() == "ready"
        except OSError as e:
            out["load_started"] = f"no load: {e}"
        if load is not None:
            pids["gpu-load"] = [load.pid]
            time.sleep(min(4.0, load_seconds / 2))
            sampler.sample_once()   # rates (energy, counters) need two samples under load
            time.sleep(1.0)
            out["loaded"] = MessageToDict(sampler.sample_once())
        if set_power_limit:
            out["power_limit"] = power_limit(sampler.gpus)
    finally:
        if load is not None:
            load.wait(timeout=load_seconds + 30)
        sampler.gpus.close()
    return out


def power_limit(gpus: Any) -> dict[str, Any]:
    """GPU 0's limit set 100 W lower (not under its minimum), read back over 3 s (the collector's
    enforced limit, NVML's management limit, nvidia-smi's current and requested), then restored."""
    import pynvml

    device = gpus.devices()[0]
    target = max(device.power_min_w, device.power_limit_w - 100.0)
    result: dict[str, Any] = {"before_w": device.power_limit_w, "min_w": device.power_min_w,
                              "max_w": device.power_max_w, "asked_w": target}
    try:
        gpus.set_power_limit(0, target)
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        polls = []
        started = time.monotonic()
        while time.monotonic() - started < 3.0:
            smi = subprocess.run(["nvidia-smi", "--query-gpu=power.limit,enforced.power.limit,power.draw",
                                  "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
            polls.append({"t_s": round(time.monotonic() - started, 2),
                          "enforced_mw": pynvml.nvmlDeviceGetEnforcedPowerLimit(handle),
                          "management_mw": pynvml.nvmlDeviceGetPowerManagementLimit(handle),
                          "collector_w": gpus.collect()[0].power_limit_w, "nvidia_smi": smi})
            time.sleep(0.5)
        result["polls"] = polls
        result["read_back_w"] = polls[-1]["collector_w"]
    except Exception as e:   # the point is to record what the host allows
        result["set_failed"] = f"{type(e).__name__}: {e}"
    finally:
        try:
            gpus.set_power_limit(0, device.power_limit_w)
            result["restored_w"] = gpus.collect()[0].power_limit_w
        except Exception as e:
            result["restore_failed"] = f"{type(e).__name__}: {e}"
    return result


def nvml_costs(rounds: int = 30) -> dict[str, Any]:
    """Milliseconds of CPU and wall per call of each field the collector reads, GPU 0, mean of ``rounds``."""
    import pynvml

    from agent.collectors import nvml as collector

    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        costs = {}
        for field, call in collector._FIELDS.items():
            cpu0, wall0 = time.process_time(), time.perf_counter()
            error = ""
            for _ in range(rounds):
                try:
                    call(pynvml, handle)
                except pynvml.NVMLError as e:
                    error = str(e)
            costs[field] = {"cpu_ms": round((time.process_time() - cpu0) * 1000 / rounds, 3),
                            "wall_ms": round((time.perf_counter() - wall0) * 1000 / rounds, 3),
                            **({"error": error} if error else {})}
        return costs
    finally:
        pynvml.nvmlShutdown()


def collector_cost(ticks: int = 40) -> dict[str, Any]:
    """CPU ms per tick of the NVML collector over every GPU, the energy counter read every tick and
    every ``ENERGY_READ_S`` (ticks 1 s apart on the collector's clock, back to back in real time)."""
    from agent.collectors.nvml import ENERGY_READ_S, open_nvml
    from common.logging import get_logger

    log = get_logger("gpu_check")
    out: dict[str, Any] = {}
    tick = [0.0]
    for every_s in (0.0, ENERGY_READ_S):
        gpus = open_nvml(log, clock=lambda: tick[0], energy_read_s=every_s)
        try:
            out["gpus"] = len(gpus.devices())
            started = time.process_time()
            for _ in range(ticks):
                gpus.collect()
                tick[0] += 1.0
            spent_ms = (time.process_time() - started) * 1000
            out[f"energy every {every_s:g} s: cpu_ms_per_tick"] = round(spent_ms / ticks, 3)
        finally:
            gpus.close()
    return out


def rss_by_mapping(pid: int) -> dict[str, int]:
    """Resident KB of process ``pid`` per mapped file (anonymous memory as ``[anon]``)."""
    totals: dict[str, int] = {}
    current = "[anon]"
    with open(f"/proc/{pid}/smaps") as smaps:
        for line in smaps:
            head = line.split(maxsplit=1)[0] if line.strip() else ""
            if "-" in head and not head.endswith(":"):
                parts = line.split()
                current = os.path.basename(parts[5]) if len(parts) > 5 else "[anon]"
            elif line.startswith("Rss:"):
                totals[current] = totals.get(current, 0) + int(line.split()[1])
    return totals


def agent_run(out_dir: Path, seconds: float, backend: str = "nvml") -> dict[str, Any]:
    """Step 4: the daemon with NVML and a metrics endpoint, no coordinator; its /metrics and RSS."""
    import psutil
    from prometheus_client.parser import text_string_to_metric_families

    from coordinator.etcd_embedded import free_port

    port = free_port()
    floor = subprocess.Popen([sys.executable, "-c", FLOOR.format(repo=str(REPO))], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    assert floor.stdout is not None and floor.stdin is not None
    floor.stdout.readline()
    floor_mb = psutil.Process(floor.pid).memory_info().rss / 1e6
    floor_maps = rss_by_mapping(floor.pid)
    floor.stdin.close()
    floor.wait()
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as state:
        argv = [sys.executable, "-m", "agent.daemon", "--insecure", "--coordinator", f"127.0.0.1:{free_port()}",
                "--node-id", "gpu-check", "--advertise-address", "127.0.0.1", "--gpu-backend", backend,
                "--metrics-listen", f"127.0.0.1:{port}", "--state-dir", state, "--runtime", "process",
                "--log-level", "info"]
        log = (out_dir / "agent.log").open("w")
        agent = subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        try:
            ps = psutil.Process(agent.pid)
            time.sleep(3.0)
            cpu0, wall0 = ps.cpu_times(), time.monotonic()
            time.sleep(max(seconds - 3.0, 2.0))
            cpu1, wall1 = ps.cpu_times(), time.monotonic()
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
            rss_mb = ps.memory_info().rss / 1e6
            maps = rss_by_mapping(agent.pid)
            threads = ps.num_threads()
        finally:
            agent.terminate()
            agent.wait(timeout=15)
            log.close()
    (out_dir / "metrics.txt").write_text(text)
    families = {f.name: f for f in text_string_to_metric_families(text)}
    dcgm = sorted(n for n in families if n.startswith("DCGM_FI_"))
    first = {n: {s.labels.get("gpu", ""): s.value for s in families[n].samples} for n in dcgm}
    collectors = {s.labels.get("collector", ""): s.value for s in families["gptrm_agent_collector_success"].samples} \
        if "gptrm_agent_collector_success" in families else {}
    cpu_s = (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)
    grown = sorted(((name, kb - floor_maps.get(name, 0)) for name, kb in maps.items()), key=lambda x: -x[1])
    return {"rss_mb": round(rss_mb, 1), "import_floor_mb": round(floor_mb, 1), "threads": threads,
            "grown_kb_by_mapping": [g for g in grown if g[1] > 100][:12],
            "over_floor_mb": round(rss_mb - floor_mb, 1), "cpu_pct_of_core": round(100 * cpu_s / (wall1 - wall0), 2),
            "dcgm_names": dcgm, "dcgm_values": first, "collector_success": collectors,
            "labels_of_first_gpu_util": next((s.labels for s in families["DCGM_FI_DEV_GPU_UTIL"].samples), {})
            if "DCGM_FI_DEV_GPU_UTIL" in families else {}}


def main() -> None:
    """Run the four steps, write the JSON, print a summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--load-seconds", type=float, default=12.0)
    parser.add_argument("--agent-seconds", type=float, default=10.0)
    parser.add_argument("--set-power-limit", action="store_true",
                        help="set GPU 0's power limit 100 W lower for 3 s, then restore it (changes the GPU's "
                             "setting meanwhile: only on a host that is yours to change)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"uid": os.getuid(), "python": sys.version.split()[0]}
    for name, step in (("inventory", inventory), ("nvml_costs", nvml_costs), ("collector_cost", collector_cost),
                       ("readings", lambda: readings(args.load_seconds, args.set_power_limit)),
                       ("agent", lambda: agent_run(args.out, args.agent_seconds))):
        started = time.monotonic()
        try:
            report[name] = step()
        except Exception as e:   # record and go on: one step's failure is a finding, not the end
            import traceback

            report[name] = {"failed": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
        print(f"== {name} ({time.monotonic() - started:.1f} s)", flush=True)
        print(json.dumps(report[name], indent=1, default=str)[:6000], flush=True)
    (args.out / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
