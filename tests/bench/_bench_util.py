"""Shared helpers of the process-level benchmarks (bench_ingest, bench_submit, bench_failover): not a test module.

Child processes (embedded etcd, coordinator, agents, load generators) are started with
their output in log files under a temporary directory and are always stopped by the
caller's ``finally``; only loopback addresses are used.
"""

from __future__ import annotations

import contextlib
import math
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TypeVar

import grpc
import psutil

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # run from anywhere in the checkout

from common.pb.gptrm.v1 import admin_pb2, admin_pb2_grpc  # noqa: E402
from coordinator.etcd_embedded import free_port  # noqa: E402
from tests.integration.harness import Proc, wait_until  # noqa: E402

BIN = Path(sys.executable).parent
T = TypeVar("T")

__all__ = ["BIN", "REPO", "CpuMeter", "Proc", "coordinator_argv", "free_port", "percentile", "wait_leader",
           "wait_until", "work_dir"]


@contextlib.contextmanager
def work_dir(keep_dir: str, prefix: str) -> Iterator[Path]:
    """Where a benchmark's processes keep state and logs: ``keep_dir`` when given, else a temporary
    directory removed afterwards. When the benchmark fails, the tail of every log is printed first.

    :param keep_dir: a directory to keep ("" for a temporary one).
    :param prefix: the temporary directory's name prefix.
    :returns: a context manager yielding the directory.
    """
    if keep_dir:
        Path(keep_dir).mkdir(parents=True, exist_ok=True)
    with contextlib.nullcontext(keep_dir) if keep_dir else tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        try:
            yield Path(tmp)
        except BaseException:
            for log in sorted(Path(tmp).glob("*.log")):
                print(f"==== {log.name}\n{log.read_text(errors='replace')[-1500:]}", file=sys.stderr)
            raise


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of ``values``; NaN when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def coordinator_argv(listen: str, etcd_endpoints: Sequence[str], prefix: str, state_dir: Path, *,
                     metrics_listen: str = "", profile_out: Path | None = None, extra: Sequence[str] = (),
                     coordinator_id: str = "bench") -> list[str]:
    """Command line of a coordinator replica; with ``profile_out`` it runs under cProfile."""
    if profile_out is not None:
        head = [sys.executable, "-m", "cProfile", "-o", str(profile_out), "-m", "coordinator.server"]
    else:
        head = [str(BIN / "gptrm-coordinator")]
    return [*head, "--listen", listen, "--metrics-listen", metrics_listen,
            "--etcd", ",".join(f"http://{e}" for e in etcd_endpoints), "--etcd-prefix", prefix,
            "--coordinator-id", coordinator_id, "--state-dir", str(state_dir), "--insecure", *extra]


def wait_leader(address: str, timeout_s: float = 30.0, proc: Proc | None = None) -> admin_pb2.ClusterStatus:
    """Block until the coordinator at ``address`` leads; fails at once if ``proc`` exits."""
    with grpc.insecure_channel(address) as channel:
        stub = admin_pb2_grpc.AdminStub(channel)

        def leading() -> admin_pb2.ClusterStatus | None:
            if proc is not None and not proc.alive:
                raise RuntimeError(f"the coordinator exited with {proc.proc.returncode}; its log:\n{proc.tail()}")
            s = stub.GetStatus(admin_pb2.GetStatusRequest(), timeout=2)
            return s if s.is_leader else None

        return wait_until(leading, timeout_s, what=f"the coordinator at {address} to lead")


class CpuMeter:
    """CPU (% of one core) and RSS of a process between :meth:`start` and :meth:`read`.

    Besides the whole process (all threads) it tracks the main thread alone: for an asyncio
    server that is the event loop, which saturates at 100 % whatever the number of cores.
    """

    def __init__(self, pid: int) -> None:
        self.proc = psutil.Process(pid)
        self._cpu0 = 0.0
        self._main0 = 0.0
        self._t0 = 0.0
        self.main_pct = 0.0

    def _cpu(self) -> tuple[float, float]:
        t = self.proc.cpu_times()
        main = next((th.user_time + th.system_time for th in self.proc.threads() if th.id == self.proc.pid), 0.0)
        return t.user + t.system, main

    def start(self) -> None:
        (self._cpu0, self._main0), self._t0 = self._cpu(), time.monotonic()

    def read(self) -> tuple[float, float]:
        """(CPU % of one core since start, RSS MB now); the main thread's share goes to ``main_pct``."""
        (cpu, main), now = self._cpu(), time.monotonic()
        wall = max(1e-9, now - self._t0)
        self.main_pct = 100.0 * (main - self._main0) / wall
        return 100.0 * (cpu - self._cpu0) / wall, self.proc.memory_info().rss / 2**20
