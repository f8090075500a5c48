"""Benchmark: submit-to-RUNNING latency of short tasks on a local cluster.

Run: ``.venv/bin/python tests/bench/bench_submit.py [--tasks 200] [--rate 10] [--agents 2] [--image]``.

It starts a single-member embedded etcd, one ``gptrm-coordinator`` and ``--agents`` real
``gptrm-agent`` processes (``--gpu-backend simulated --simulate-gpus 8xH100-80GB
--interval 0.5``) on loopback, then submits ``--tasks`` tasks (``argv = sleep 0.5``, demand
0.125 GPU and 1 GiB GPU memory per GPU, GPU sharing allowed) through the Admin
``SubmitTask`` RPC at a steady ``--rate``. Latency = the time of the task's RUNNING entry in
``Task.history`` (written by the coordinator when the agent reports the process started)
minus the time the ``SubmitTask`` call returned; both clocks are this host's. The history
also splits it (each entry is stamped by the coordinator when its etcd transaction runs):
submit → SCHEDULED (from the task's submit time: queue, placement, etcd commit), SCHEDULED →
STARTING (decision to the agent, fork/exec, durable task table, status back, one transaction)
and STARTING → RUNNING (the agent's RUNNING event, one more transaction).

With ``--image`` the same tasks are then measured again in the same run, each with ``--image`` (the command
runs in a container: ``sleep`` inside a small image from ``tests/helpers/oci.py``), the image cached: it is
served by a ``docker-registry`` on loopback and pre-pulled into every agent's store before either phase (needs
root and crun, skopeo, umoci, docker-registry). Both rows are printed together at the end. The RUNNING entry is
written when the agent has spawned the task's root wrapper, before crun sets the container up; so in this mode
every task (both phases) also prints its own start time first (``sh -c 'date +%s.%N; exec sleep S'``, read back
from its log), and "submit return → command's first line" is measured to that.

Baselines in the same run: the round trip of a bare ``GetStatus`` RPC, the ``SubmitTask``
RPC itself (it writes the task to etcd), and a local fork/exec of ``sleep 0`` through
``sh -c`` as the agent's runtime does. ``--warmup`` tasks run first and are not counted.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_util import BIN, Proc, coordinator_argv, free_port, percentile, wait_leader, wait_until, work_dir

from agent.taskfs import TaskPaths
from common.pb.gptrm.v1 import admin_pb2, admin_pb2_grpc, types_pb2
from coordinator.etcd_embedded import EmbeddedEtcd

GIB = 1 << 30
RUNNING = types_pb2.TASK_STATE_RUNNING
SCHEDULED = types_pb2.TASK_STATE_SCHEDULED
STARTING = types_pb2.TASK_STATE_STARTING
TERMINAL = {types_pb2.TASK_STATE_SUCCEEDED, types_pb2.TASK_STATE_FAILED, types_pb2.TASK_STATE_CANCELLED}


def argv(args: argparse.Namespace) -> list[str]:
    """The tasks' command: ``sleep``; with ``--image`` (both phases) it prints its start time first."""
    if args.image:
        return ["sh", "-c", f"date +%s.%N; exec sleep {args.task_seconds:g}"]
    return ["sleep", f"{args.task_seconds:g}"]


def spec(i: int, args: argparse.Namespace, image: str = "") -> types_pb2.TaskSpec:
    demand = types_pb2.ResourceVector(gpus=args.gpus, gpu_mem_bytes=int(args.gpu_mem_gib * GIB),
                                      cpu_cores=args.cpu_cores)
    return types_pb2.TaskSpec(name=f"bench-{i}", kind=types_pb2.TASK_KIND_INFERENCE,
                              argv=argv(args), has_demand=True, demand=demand,
                              allow_gpu_sharing=True, image=image)


def history_time(task: types_pb2.Task, state: int) -> float | None:
    return next((h.time_unix_s for h in task.history if h.state == state), None)


def stats_line(name: str, values: list[float], unit: float = 1000.0, suffix: str = "ms") -> str:
    if not values:
        return f"{name:<38} (no values)"
    return (f"{name:<38} n={len(values):<5} p50 {percentile(values, 50) * unit:8.1f}{suffix}  "
            f"p99 {percentile(values, 99) * unit:8.1f}{suffix}  max {max(values) * unit:8.1f}{suffix}  "
            f"mean {statistics.fmean(values) * unit:8.1f}{suffix}")


def baseline_rpc(stub: admin_pb2_grpc.AdminStub, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        stub.GetStatus(admin_pb2.GetStatusRequest(), timeout=5)
        out.append(time.perf_counter() - t0)
    return out


def baseline_fork(n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run(["sh", "-c", '"$@"', "sh", "sleep", "0"], check=True)
        out.append(time.perf_counter() - t0)
    return out


def submit_all(stub: admin_pb2_grpc.AdminStub, count: int, rate: float, args: argparse.Namespace,
               first: int, image: str = "") -> tuple[dict[str, float], list[float], float]:
    """Submit ``count`` tasks at ``rate``/s; returns ({task id: time the call returned}, RPC seconds, start time)."""
    returned: dict[str, float] = {}
    rpc: list[float] = []
    start = time.time()
    for i in range(count):
        delay = start + i / rate - time.time()
        if delay > 0:
            time.sleep(delay)
        t0 = time.time()
        request = admin_pb2.SubmitTaskRequest(spec=spec(first + i, args, image), request_id=f"bench-{first + i}")
        task = stub.SubmitTask(request, timeout=30)
        t1 = time.time()
        returned[task.id] = t1
        rpc.append(t1 - t0)
    return returned, rpc, start


def list_tasks(stub: admin_pb2_grpc.AdminStub) -> list[types_pb2.Task]:
    """Every task, following ListTasks pages."""
    out: list[types_pb2.Task] = []
    request = admin_pb2.ListTasksRequest(page_size=1000)
    while True:
        resp = stub.ListTasks(request, timeout=30)
        out.extend(resp.tasks)
        if not resp.next_page_token:
            return out
        request.page_token = resp.next_page_token


def wait_running(stub: admin_pb2_grpc.AdminStub, ids: set[str], timeout_s: float) -> dict[str, types_pb2.Task]:
    """Wait until every task in ``ids`` has a RUNNING history entry (or ended); returns them."""
    def done() -> dict[str, types_pb2.Task] | None:
        tasks = {t.id: t for t in list_tasks(stub) if t.id in ids}
        finished = [t for t in tasks.values() if history_time(t, RUNNING) is not None or t.state in TERMINAL]
        return tasks if len(finished) == len(ids) else None

    try:
        return wait_until(done, timeout_s, interval_s=0.5, what="every task to reach RUNNING")
    except AssertionError:  # wait_until timed out
        tasks = {t.id: t for t in list_tasks(stub) if t.id in ids}
        stuck = [t for t in tasks.values() if history_time(t, RUNNING) is None]
        print(f"warning: {len(stuck)} of {len(ids)} tasks never reached RUNNING within {timeout_s:.0f}s; e.g. "
              + "; ".join(f"{t.id} {types_pb2.TaskState.Name(t.state)} {t.reason!r}" for t in stuck[:3]))
        return tasks


def started_at(tmp: Path, agents: int, ids: set[str]) -> dict[str, float]:
    """The time each task's command printed as its first line (``--image`` runs): read from its log on its agent."""
    def read() -> dict[str, float] | None:
        found: dict[str, float] = {}
        for tid in ids:
            for a in range(agents):
                log = TaskPaths.of(tmp / f"agent-{a}", tid).log
                line = log.read_text().split("\n", 1)[0] if log.exists() else ""
                if line:
                    found[tid] = float(line)
        return found if len(found) == len(ids) else None

    try:
        return wait_until(read, 30.0, interval_s=0.5, what="every task's start time in its log")
    except AssertionError:
        print("warning: some tasks never printed their start time")
        return {}


def measure(stub: admin_pb2_grpc.AdminStub, args: argparse.Namespace, tmp: Path, first: int,
            image: str = "") -> dict[str, list[float]]:
    """Run ``--warmup`` then ``--tasks`` tasks (numbered from ``first``), with ``image`` when given; print their
    figures and return them by row name."""
    if args.warmup:
        warm, _, _ = submit_all(stub, args.warmup, args.rate, args, first=first, image=image)
        wait_running(stub, set(warm), 60.0)
    returned, submit_rpc, started = submit_all(stub, args.tasks, args.rate, args, first=first + args.warmup,
                                               image=image)
    tasks = wait_running(stub, set(returned), args.timeout)

    latency, to_sched, sched_to_start, start_to_run, ran_at = [], [], [], [], []
    for tid, t_ret in returned.items():
        task = tasks.get(tid)
        t_run = history_time(task, RUNNING) if task is not None else None
        if task is None or t_run is None:
            continue
        latency.append(t_run - t_ret)
        ran_at.append(t_run)
        t_sched, t_start = history_time(task, SCHEDULED), history_time(task, STARTING)
        if t_sched is not None and t_start is not None:
            to_sched.append(t_sched - task.submit_unix_s)
            sched_to_start.append(t_start - t_sched)
            start_to_run.append(t_run - t_start)
    submit_s = max(returned.values()) - started
    span = max(ran_at) - started if ran_at else float("nan")
    own = started_at(tmp, args.agents, set(returned)) if args.image else {}
    command = [own[tid] - t_ret for tid, t_ret in returned.items() if tid in own]

    print(f"\nsubmit → RUNNING{' with --image ' + image + ' (cached)' if image else ''}: {args.tasks} tasks "
          f"(argv sleep {args.task_seconds:g}, {args.gpus:g} GPU + {args.gpu_mem_gib:g} GiB, sharing) at "
          f"{args.rate:g}/s requested, {args.tasks / submit_s:.1f}/s achieved")
    print(stats_line("submit return → RUNNING (history)", latency))
    print(stats_line("  of which submit → SCHEDULED", to_sched))
    print(stats_line("  of which SCHEDULED → STARTING", sched_to_start))
    print(stats_line("  of which STARTING → RUNNING", start_to_run))
    if args.image:
        print(stats_line("submit return → command's first line", command))
    print(f"{'throughput':<38} {len(latency)} tasks RUNNING {span:.2f}s after the first submit = "
          f"{len(latency) / span:.1f} tasks/s"
          + (f"  ({args.tasks - len(latency)} never ran)" if len(latency) < args.tasks else ""), flush=True)
    return {"latency": latency, "command": command, "submit_rpc": submit_rpc}


def image_ready(tmp: Path, stack: contextlib.ExitStack) -> str:
    """A registry on loopback (stopped with ``stack``) holding the benchmark's image; returns its reference."""
    from tests.helpers import oci

    address = stack.enter_context(oci.registry(tmp / "registry"))
    (tmp / "image").mkdir()
    return oci.push(oci.build_image(tmp / "image"), address, "bench/img:1")


def prepull(stub: admin_pb2_grpc.AdminStub, image: str, agents: int) -> None:
    """Pull ``image`` into every agent's store and wait until each reports holding it."""
    stub.PullImage(admin_pb2.PullImageRequest(image=image), timeout=30)
    wait_until(lambda: sum(1 for n in stub.ListNodes(admin_pb2.ListNodesRequest(), timeout=5).nodes
                           if image in n.record.inventory.images) >= agents,
               120.0, what=f"{image} in every agent's store")


def run(args: argparse.Namespace, tmp: Path) -> None:
    etcd = EmbeddedEtcd(tmp / "etcd")
    procs: list[Proc] = []
    stack = contextlib.ExitStack()
    try:
        image = ""
        agent_flags: list[str] = []
        if args.image:
            tmp.chmod(0o755)   # the tasks' own uids traverse the agents' state directories to their containers
            image = image_ready(tmp, stack)
            agent_flags = ["--image-insecure-registries", image.split("/", 1)[0]]
        etcd.start()
        listen = f"127.0.0.1:{free_port()}"
        prefix = f"/bench/submit-{os.getpid()}-{int(time.time())}/"
        coord = Proc(coordinator_argv(listen, etcd.endpoints, prefix, tmp / "coordinator",
                                      extra=args.coordinator_args.split()), tmp / "coordinator.log").start()
        procs.append(coord)
        wait_leader(listen, 60.0, coord)
        for a in range(args.agents):
            procs.append(Proc([str(BIN / "gptrm-agent"), "--coordinator", listen, "--node-id", f"bench-agent-{a}",
                               "--gpu-backend", "simulated", "--simulate-gpus", args.simulate_gpus,
                               "--interval", str(args.interval), "--state-dir", str(tmp / f"agent-{a}"),
                               "--backoff-max", "1", "--advertise-address", "127.0.0.1", "--insecure",
                               *agent_flags], tmp / f"agent-{a}.log").start())
        with grpc.insecure_channel(listen) as channel:
            stub = admin_pb2_grpc.AdminStub(channel)
            wait_until(lambda: sum(1 for n in stub.ListNodes(admin_pb2.ListNodesRequest(), timeout=5).nodes
                                   if n.state == types_pb2.NODE_STATE_READY and n.has_latest) >= args.agents,
                       60.0, what=f"{args.agents} READY agents with telemetry")
            print(f"cluster: embedded etcd, 1 coordinator, {args.agents} agent(s) × {args.simulate_gpus} simulated, "
                  f"agent interval {args.interval:g}s; {os.cpu_count()} CPUs, load average "
                  + " ".join(f"{x:.1f}" for x in os.getloadavg()), flush=True)
            if image:
                prepull(stub, image, args.agents)

            status_rtt = baseline_rpc(stub, args.baseline_n)
            fork = baseline_fork(args.baseline_n)

            plain = measure(stub, args, tmp, first=0)
            with_image = measure(stub, args, tmp, first=args.warmup + args.tasks, image=image) if image else None

        if with_image is not None:
            print("\nsame run, host process vs --image (cached):")
            print(stats_line("  submit → RUNNING, host", plain["latency"]))
            print(stats_line("  submit → RUNNING, --image", with_image["latency"]))
            print(stats_line("  submit → command running, host", plain["command"]))
            print(stats_line("  submit → command running, --image", with_image["command"]))
        print("baselines (same run):")
        print(stats_line("  SubmitTask RPC (etcd write)", plain["submit_rpc"]))
        print(stats_line("  GetStatus RPC round trip", status_rtt))
        print(stats_line("  fork/exec sh -c 'sleep 0'", fork))
        print("load average at the end: " + " ".join(f"{x:.1f}" for x in os.getloadavg()))
    finally:
        for p in reversed(procs):
            status = p.stop()
            if status not in (0, None, -15):
                print(f"{p.log_path.name} exited with {status}; tail:\n{p.tail(1500)}", file=sys.stderr)
        etcd.stop()
        stack.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", type=int, default=200, help="tasks measured")
    p.add_argument("--rate", type=float, default=10.0, help="submissions per second")
    p.add_argument("--agents", type=int, default=2, help="agent processes")
    p.add_argument("--simulate-gpus", default="8xH100-80GB")
    p.add_argument("--interval", type=float, default=0.5, help="agent sampling interval, seconds")
    p.add_argument("--task-seconds", type=float, default=0.5, help="each task runs sleep SECONDS")
    p.add_argument("--gpus", type=float, default=0.125, help="GPUs per task")
    p.add_argument("--gpu-mem-gib", type=float, default=1.0, help="GPU memory per GPU, GiB")
    p.add_argument("--cpu-cores", type=float, default=0.1,
                   help="host cores per task (0: the profiler's default of 1; simulated nodes report this host's "
                        "real cores, 2 here, so only one such task per node fits under threshold 0.9)")
    p.add_argument("--warmup", type=int, default=5, help="tasks run first, not counted")
    p.add_argument("--baseline-n", type=int, default=200, help="samples of each baseline")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the last task to run")
    p.add_argument("--coordinator-args", default="", help="extra coordinator flags, space-separated")
    p.add_argument("--image", action="store_true",
                   help="measure the same tasks again with an image (cached), in the same run (root; crun, skopeo, "
                        "umoci, docker-registry)")
    p.add_argument("--keep-dir", default="", help="keep state and logs in this directory instead of a temporary one")
    args = p.parse_args()
    if args.image:
        from tests.helpers.oci import missing_tools

        if os.geteuid() != 0 or missing_tools():
            p.error(f"--image: needs root and {', '.join(missing_tools()) or 'root'}")
    with work_dir(args.keep_dir, "gptrm-bench-submit-") as tmp:
        run(args, tmp)


if __name__ == "__main__":
    main()
