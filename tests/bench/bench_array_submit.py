"""Benchmark: one SubmitTask of an array, from the request to every element stored and in the leader's memory.

Run: ``.venv/bin/python tests/bench/bench_array_submit.py [--elements 10000] [--rounds 3]``.
It starts its own single-member embedded etcd in a temporary directory, builds a leading coordinator in this
process (``coordinator.app.build``, as ``tests/helpers/inproc.py`` does) and serves its Admin API on a loopback
port; each round submits one array of ``--elements`` (``%64``, no node needed: ``queue_unplaceable``) over
gRPC, then retries the same request (which writes nothing). The goal is an array of 10,000 accepted in ≤ 2 s.
The last line reads ``array: elements=N best_s=X worst_s=Y retry_s=Z``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere in the checkout

from common.logging import configure_logging
from common.pb.gptrm.v1 import admin_pb2, types_pb2
from coordinator.api.admin import AdminService
from coordinator.app import App
from coordinator.etcd_embedded import EmbeddedEtcd
from tests.helpers.inproc import admin_stub, one_gpu_spec, run_leading


async def _rounds(app: App, elements: int, rounds: int, out: list[tuple[float, float]]) -> None:
    async with admin_stub(AdminService(app)) as stub:
        for r in range(rounds):
            spec = one_gpu_spec("sweep")
            spec.array.CopyFrom(types_pb2.ArraySpec(first=0, last=elements - 1, max_running=64))
            request = admin_pb2.SubmitTaskRequest(spec=spec, request_id=f"bench-{r}", queue_unplaceable=True)
            started = time.perf_counter()
            first = await stub.SubmitTask(request, timeout=120)
            took = time.perf_counter() - started
            started = time.perf_counter()
            await stub.SubmitTask(request, timeout=120)
            out.append((took, time.perf_counter() - started))
            assert len(app.tasks.array_elements(first.array_id)) == elements
            print(f"round {r}: {elements} elements accepted in {took:.3f} s (retry {out[-1][1]:.3f} s)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--elements", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    configure_logging("warning")
    results: list[tuple[float, float]] = []
    with tempfile.TemporaryDirectory(prefix="gptrm-bench-array-") as tmp:
        etcd = EmbeddedEtcd(Path(tmp))
        etcd.start()
        try:
            asyncio.run(run_leading(etcd.endpoints, "/bench-array/",
                                    lambda app: _rounds(app, args.elements, args.rounds, results)))
        finally:
            etcd.stop()
    took = [t for t, _ in results]
    print(f"array: elements={args.elements} best_s={min(took):.3f} worst_s={max(took):.3f} "
          f"retry_s={min(r for _, r in results):.3f}")


if __name__ == "__main__":
    main()
