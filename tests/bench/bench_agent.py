"""Agent sampling footprint: resident memory and CPU time per sample, against the budget.

Runs the sampler at 1 Hz in a child process for ~20 s with (a) 8 simulated GPUs and
(b) 8 GPUs behind the fake pynvml, and compares with two floors: a bare ``python`` and a
``python`` that only imports grpc, protobuf, psutil, structlog and pynvml. The sampler
child imports grpc as well, as the agent daemon does.

GPU health watching (agent/health) is measured against its own baseline in the same run: the
fake-NVML sampler with ``--gpu-health off`` (only the tick's fields) and on (the XID event thread
waiting in ``nvmlEventSetWait_v2``, the clocks reasons every tick, the slow signals every 10 s), and
the simulated sampler following a ``--simulate-faults`` file that has a fault appended every second.
The fake's event wait blocks on a queue with the same timeout as the real one blocks in NVML, so the
thread's wake-ups are counted; the real NVML calls' own cost is measured on a GPU by
tests/device/nvml_health.py.

Then the agent itself: ``gptrm-agent`` (``python -m agent.daemon``) with 8 simulated GPUs,
reconnecting to a coordinator that is not there and streaming to one (an embedded etcd and a
coordinator on loopback), beside its import floor, a ``python`` that
only imports ``agent.daemon`` (every module the agent loads, nothing run), and that floor with
grpc's own set-up: the same imports and one ``grpc.aio`` channel made, tried on a closed port
and closed (what any process pays for its first grpc channel, whatever it does next). The goal is the
agent's RSS within 3 MB of its import floor: what it holds once running (samples, buffers,
threads) is small next to the code it imports, so the floor is what an install trims. Run it
with the interpreter of the install being measured (an agent-only venv imports less than the
test venv, where structlog also finds rich). Each agent line splits its excess into anonymous
memory (what it holds) and the pages of grpc's compiled library that grpc's initialisation and
channel set-up touched (file-backed code; shared with any other process using that file).

    .venv/bin/python tests/bench/bench_agent.py [--seconds 20]
    .venv/bin/python -m pytest tests/bench/bench_agent.py      # shorter run, asserts the budget

Budget: ≤ 45 MB RSS and ≤ 1 % of one core; goal: agent RSS ≤ its import floor + 3 MB.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))   # _bench_util, beside this file
RSS_BUDGET_MB = 45.0
CPU_BUDGET_PCT = 1.0
# The running agent's RSS may exceed its import floor by this much.
AGENT_OVER_FLOOR_GOAL_MB = 3.0

# The child: sample at 1 Hz for SECONDS, report on stdout, then wait until stdin closes so
# the parent can measure the still-running process.
DRIVER = r"""
import json, os, sys, threading, time
sys.path.insert(0, {repo!r})
mode, seconds, health, faults = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4]
import grpc  # the daemon imports it; count it in the footprint
from common.logging import configure_logging, get_logger
configure_logging("error", json=True)   # the fault file's health changes are warnings
pid = os.getpid()
if mode == "nvml":
    from tests.helpers import fake_pynvml
    gpus = fake_pynvml.make_gpus(8, util_gpu=80, power_mw=550_000, mem_used=60 << 30, processes=[(pid, 60 << 30)],
                                 nvswitch_links=18)
    sys.modules["pynvml"] = fake_pynvml.FakeNvml(gpus)
from agent.health import HealthOptions
from agent.sampler import build_sampler
sampler = build_sampler(node_id="bench", gpu_backend=mode, simulate_spec="8xH100-80GB", interval_s=1.0,
                        log=get_logger("agent"), data_paths=["/"], task_pids=lambda: {{"t1": [pid]}},
                        health=HealthOptions(enabled=health == "on", simulate_faults=faults))
if mode == "simulated":
    sampler.gpus.place("t1", range(8), util_per_gpu=0.8, mem_bytes_per_gpu=60 << 30, pids=[pid])
marks = []
def emit(sample):
    sample.SerializeToString()
    marks.append((time.monotonic(), time.process_time()))
    if faults:   # one fault a second, cycling through the kinds (the file is followed like tail -f)
        n = len(marks)
        with open(faults, "a") as f:
            f.write(json.dumps([{{"gpu": n % 8, "xid": 13}}, {{"gpu": n % 8, "throttle": "thermal"}},
                                {{"gpu": n % 8, "throttle": None}}][n % 3]) + "\n")
stop = threading.Event()
threading.Timer(seconds, stop.set).start()
sampler.run(emit, stop)
print(json.dumps({{"marks": marks}}), flush=True)
sys.stdin.read()
"""

FLOOR = "import grpc, google.protobuf, psutil, structlog, pynvml, sys; print('{}', flush=True); sys.stdin.read()"
BARE = "import sys; print('{}', flush=True); sys.stdin.read()"
AGENT_FLOOR = ("import sys; sys.path.insert(0, {repo!r}); import agent.daemon; "
               "print('{{}}', flush=True); sys.stdin.read()")
# The import floor, then grpc's own set-up: one channel to a closed port, made, tried and closed.
GRPC_SETUP = ("import asyncio, sys; sys.path.insert(0, {repo!r}); import agent.daemon, grpc.aio\n"
              "async def main():\n"
              "    channel = grpc.aio.insecure_channel({target!r})\n"
              "    try:\n"
              "        await asyncio.wait_for(channel.channel_ready(), 1.0)\n"
              "    except asyncio.TimeoutError:\n"
              "        pass\n"
              "    await channel.close()\n"
              "asyncio.run(main())\n"
              "print('{{}}', flush=True); sys.stdin.read()")
AGENT_FLOOR_LABEL = "agent import floor: import agent.daemon"
GRPC_SETUP_LABEL = "import floor + one grpc channel, nothing else"
AGENT_LABEL = "gptrm-agent, 8 simulated GPUs, no coordinator"
CONNECTED_LABEL = "gptrm-agent, 8 simulated GPUs, streaming"


@dataclass(frozen=True, slots=True)
class Result:
    """One measured process."""

    label: str
    rss_mb: float
    cpu_ms_per_sample: float | None = None
    cpu_pct_of_core: float | None = None
    samples: int = 0
    anon_mb: float = 0.0   # RSS less its file-backed pages (the code of shared libraries it touched)
    grpc_code_mb: float = 0.0   # resident pages of grpc's compiled library (cygrpc)


def grpc_code_mb(pid: int) -> float:
    """Resident MB of the mappings of grpc's compiled library in process ``pid``."""
    total, current = 0, False
    with open(f"/proc/{pid}/smaps") as smaps:
        for line in smaps:
            head = line.split(maxsplit=1)[0] if line.strip() else ""
            if "-" in head and not head.endswith(":"):
                current = "grpc/_cython/cygrpc" in line
            elif current and line.startswith("Rss:"):
                total += int(line.split()[1])
    return total / 1000


def measure(label: str, argv: list[str]) -> Result:
    """Run ``argv``, wait for its JSON report line, measure its RSS while it still runs."""
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=REPO, text=True)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        report = json.loads(proc.stdout.readline() or "{}")
        mem = psutil.Process(proc.pid).memory_info()
        rss_mb, anon_mb = mem.rss / 1e6, (mem.rss - mem.shared) / 1e6
        grpc_mb = grpc_code_mb(proc.pid)
        proc.stdin.close()
        proc.wait(timeout=30)
    finally:
        proc.kill()
    marks = report.get("marks", [])
    if len(marks) < 3:
        return Result(label, rss_mb, samples=len(marks), anon_mb=anon_mb, grpc_code_mb=grpc_mb)
    # From the 2nd sample on: imports and the first-tick set-up are over.
    (wall0, cpu0), (wall1, cpu1) = marks[1], marks[-1]
    per_sample_s = (cpu1 - cpu0) / (len(marks) - 2)
    return Result(label, rss_mb, per_sample_s * 1000, 100 * (cpu1 - cpu0) / (wall1 - wall0), len(marks), anon_mb,
                  grpc_mb)


def closed_address() -> str:
    """A loopback address nothing listens on (a free port, not bound)."""
    from _bench_util import free_port

    return f"127.0.0.1:{free_port()}"


def measure_agent(seconds: float, coordinator: str = "", label: str = AGENT_LABEL) -> Result:
    """Run the agent daemon for ``seconds`` (at least 5); its RSS and CPU at the end.

    Without ``coordinator`` it points at a closed port and retries the stream with backoff; with
    one it streams to it. CPU is counted from the 3rd second on (imports and start-up are over);
    the daemon samples at 1 Hz meanwhile.
    """
    coordinator = coordinator or closed_address()
    seconds = max(seconds, 5.0)
    with tempfile.TemporaryDirectory(prefix="bench-agent-") as state:
        argv = [sys.executable, "-m", "agent.daemon", "--insecure", "--coordinator", coordinator,
                "--node-id", "bench-agent", "--advertise-address", "127.0.0.1",
                "--gpu-backend", "simulated", "--simulate-gpus", "8xH100-80GB", "--interval", "1",
                "--state-dir", state, "--runtime", "process", "--log-level", "error"]
        proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            ps = psutil.Process(proc.pid)
            time.sleep(3.0)
            t0 = ps.cpu_times()
            w0 = time.monotonic()
            time.sleep(seconds - 3.0)
            t1 = ps.cpu_times()
            w1 = time.monotonic()
            mem = ps.memory_info()
            rss_mb, anon_mb = mem.rss / 1e6, (mem.rss - mem.shared) / 1e6
            grpc_mb = grpc_code_mb(proc.pid)
            if proc.poll() is not None:
                raise RuntimeError(f"the agent exited with {proc.returncode}")
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
    cpu_s = (t1.user + t1.system) - (t0.user + t0.system)
    ticks = max(1, round(w1 - w0))
    return Result(label, rss_mb, cpu_s * 1000 / ticks, 100 * cpu_s / (w1 - w0), ticks, anon_mb, grpc_mb)


@contextlib.contextmanager
def coordinator() -> Iterator[str]:
    """An embedded etcd and a coordinator leading it on loopback; yields the coordinator's address."""
    from _bench_util import Proc, coordinator_argv, free_port, wait_leader

    from coordinator.etcd_embedded import EmbeddedEtcd

    with tempfile.TemporaryDirectory(prefix="bench-agent-coord-") as tmp:
        etcd = EmbeddedEtcd(Path(tmp) / "etcd")
        etcd.start()
        coord: Proc | None = None
        try:
            listen = f"127.0.0.1:{free_port()}"
            coord = Proc(coordinator_argv(listen, etcd.endpoints, "/bench/agent/", Path(tmp) / "coordinator"),
                         Path(tmp) / "coordinator.log").start()
            wait_leader(listen, 60.0, coord)
            yield listen
        finally:
            if coord is not None:
                coord.stop()
            etcd.stop()


HEALTH_OFF_LABEL = "sampler, 8 GPUs via fake NVML, --gpu-health off"
HEALTH_ON_LABEL = "sampler, 8 GPUs via fake NVML"   # health watching on, as by default
FAULTS_LABEL = "sampler, 8 simulated GPUs, a fault file 1 line/s"


def run_all(seconds: float) -> list[Result]:
    """Measure the two floors, the sampler with both backends (NVML with GPU health watching off and on,
    simulated with a fault file), the agent's import floor and the agent without a coordinator and
    streaming to one."""
    driver = DRIVER.format(repo=str(REPO))
    with coordinator() as address:
        connected = measure_agent(seconds, address, CONNECTED_LABEL)
    with tempfile.TemporaryDirectory(prefix="bench-agent-faults-") as tmp:
        faults = measure(FAULTS_LABEL, [sys.executable, "-c", driver, "simulated", str(seconds), "on",
                                        str(Path(tmp) / "faults.jsonl")])
    return [
        measure("bare interpreter (python -c, no imports)", [sys.executable, "-c", BARE]),
        measure("floor: grpc+protobuf+psutil+structlog+pynvml", [sys.executable, "-c", FLOOR]),
        measure("sampler, 8 simulated GPUs", [sys.executable, "-c", driver, "simulated", str(seconds), "on", ""]),
        faults,
        measure(HEALTH_OFF_LABEL, [sys.executable, "-c", driver, "nvml", str(seconds), "off", ""]),
        measure(HEALTH_ON_LABEL, [sys.executable, "-c", driver, "nvml", str(seconds), "on", ""]),
        measure(AGENT_FLOOR_LABEL, [sys.executable, "-c", AGENT_FLOOR.format(repo=str(REPO))]),
        measure(GRPC_SETUP_LABEL, [sys.executable, "-c", GRPC_SETUP.format(repo=str(REPO), target=closed_address())]),
        measure_agent(seconds),
        connected,
    ]


def agent_goal(results: list[Result]) -> tuple[Result, float, list[Result], Result]:
    """(import floor, goal RSS in MB, the agent runs, the floor with grpc's set-up)."""
    by_label = {r.label: r for r in results}
    floor = by_label[AGENT_FLOOR_LABEL]
    return (floor, floor.rss_mb + AGENT_OVER_FLOOR_GOAL_MB, [by_label[AGENT_LABEL], by_label[CONNECTED_LABEL]],
            by_label[GRPC_SETUP_LABEL])


def table(results: list[Result]) -> str:
    """The results as a fixed-width table with the budget verdict."""
    lines = [f"{'process':<48} {'RSS MB':>8} {'samples':>8} {'CPU ms/sample':>14} {'% of a core':>12}  budget"]
    for r in results:
        cpu_ms = f"{r.cpu_ms_per_sample:.2f}" if r.cpu_ms_per_sample is not None else "-"
        pct = f"{r.cpu_pct_of_core:.2f}" if r.cpu_pct_of_core is not None else "-"
        verdict = ""
        if r.cpu_pct_of_core is not None:
            ok = r.rss_mb <= RSS_BUDGET_MB and r.cpu_pct_of_core <= CPU_BUDGET_PCT
            verdict = "ok" if ok else "OVER"
        lines.append(f"{r.label:<48} {r.rss_mb:>8.1f} {r.samples:>8} {cpu_ms:>14} {pct:>12}  {verdict}")
    lines.append(f"budget: RSS <= {RSS_BUDGET_MB:.0f} MB, CPU <= {CPU_BUDGET_PCT:.0f} % of one core")
    floor, goal, agents, setup = agent_goal(results)
    lines.append(f"agent import floor {floor.rss_mb:.1f} MB (anonymous {floor.anon_mb:.1f} MB, grpc's library code "
                 f"{floor.grpc_code_mb:.1f} MB); goal: floor + {AGENT_OVER_FLOOR_GOAL_MB:.0f} MB = {goal:.1f} MB")
    lines.append(f"  grpc's own set-up, one channel made, tried on a closed port and closed in a process that runs "
                 f"nothing else: +{setup.rss_mb - floor.rss_mb:.1f} MB, of which grpc's library code "
                 f"+{setup.grpc_code_mb - floor.grpc_code_mb:.1f} MB")
    for agent in agents:
        verdict = "ok" if agent.rss_mb <= goal else "OVER"
        lines.append(f"  {agent.label}: {agent.rss_mb:.1f} MB (+{agent.rss_mb - floor.rss_mb:.1f} MB): {verdict}; "
                     f"anonymous +{agent.anon_mb - floor.anon_mb:.1f} MB, "
                     f"grpc's library code +{agent.grpc_code_mb - floor.grpc_code_mb:.1f} MB (paged in by grpc's "
                     "initialisation and channel set-up: file-backed, clean); "
                     f"+{agent.rss_mb - setup.rss_mb:.1f} MB over the floor with grpc's set-up")
    by_label = {r.label: r for r in results}
    off, on = by_label[HEALTH_OFF_LABEL], by_label[HEALTH_ON_LABEL]
    if off.cpu_pct_of_core is not None and on.cpu_pct_of_core is not None and off.cpu_ms_per_sample is not None \
            and on.cpu_ms_per_sample is not None:
        lines.append(f"GPU health watching (fake NVML, 8 GPUs, 1 Hz): off {off.cpu_pct_of_core:.2f} %, on "
                     f"{on.cpu_pct_of_core:.2f} % of a core ({on.cpu_ms_per_sample - off.cpu_ms_per_sample:+.2f} ms "
                     "per sample); budget with it on: 1 %")
    lines.append(f"interpreter: {sys.executable}")
    return "\n".join(lines)


def test_sampler_within_budget() -> None:
    """The sampler with 8 GPUs (simulated and NVML) stays within 45 MB RSS and 1 % of a core."""
    results = run_all(seconds=8.0)
    print(table(results))
    for r in [r for r in results if r.cpu_pct_of_core is not None]:   # the running samplers and agents
        assert r.samples >= 5, f"{r.label}: only {r.samples} samples"
        assert r.rss_mb <= RSS_BUDGET_MB, f"{r.label}: {r.rss_mb:.1f} MB RSS"
        assert r.cpu_pct_of_core is not None and r.cpu_pct_of_core <= CPU_BUDGET_PCT, f"{r.label}: {r.cpu_pct_of_core}"


def main() -> None:
    """Print the table for a ``--seconds`` long run of each sampler."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="how long each sampler runs")
    args = parser.parse_args()
    started = time.monotonic()
    print(table(run_all(args.seconds)))
    print(f"(took {time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
