"""A GPU that turns unhealthy, end to end: real coordinator, agent and task processes on simulated GPUs, faults
injected through the agents' ``--simulate-faults`` files.

A task on a GPU that fails (XID 79) gets its checkpoint signal, is requeued (not counted as a restart) and runs
again on healthy GPUs of the same node; the GPU stays fenced, shown by the node, until an admin resumes it; a new
leader carries the move on; a gang is requeued whole; an elastic task shrinks off the GPU; an application's own
XID (13) is recorded on its task and changes nothing else (docs/gpu-health-moves.md).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from common.pb.gptrm.v1 import admin_pb2, types_pb2
from tests.integration.harness import ROOT_TASKS_AGENT, ROOT_TASKS_SUBMIT, Cluster, assert_gpus_held_once, wait_until

_MOVE_S = 5.0          # the signal reaches a task within this long of its GPU's fault
_UIDS = 1879048192     # agents on one host take task uids from ranges of their own (see test_gang.py)


def _start(c: Cluster, tmp: Path, nodes: tuple[str, ...] = ("n1",), gpus: str = "8xH100-80GB",
           coordinators: tuple[str, ...] = ("c1",), flags: tuple[str, ...] = ()) -> dict[str, Path]:
    """Coordinators (the first one leading) and an agent per node with a faults file each; the files by node."""
    for i, name in enumerate(coordinators):
        c.start_coordinator(name, "--threshold", "1.0", *flags)
        if i == 0:
            c.wait_leader(name)
    faults = {}
    for i, node in enumerate(nodes):
        faults[node] = tmp / f"faults-{node}.jsonl"
        faults[node].touch()
        first = _UIDS + 512 * i
        c.start_agent(node, "--simulate-gpus", gpus, "--simulate-faults", str(faults[node]),
                      "--task-uids", f"{first}-{first + 511}", *ROOT_TASKS_AGENT)
    wait_until(lambda: sum(n["state"] == "ready" for n in c.ctl_json("nodes")["nodes"]) == len(nodes),
               what="ready nodes")
    return faults


def _inject(faults: Path, **fault: object) -> None:
    """Append one fault line, as an operator (or a demo) would while the agent runs."""
    with faults.open("a") as f:
        f.write(json.dumps(fault) + "\n")


def _script(starts: Path, ckpt: Path) -> str:
    """A task that notes each start, and on SIGUSR1 (its checkpoint signal) notes it with its rank and exits."""
    return (f'echo "$GPTRM_RESTART_COUNT" >> {starts}; '
            f"trap 'echo \"checkpoint ${{NODE_RANK:-0}}\" >> {ckpt}; exit 0' USR1; while true; do sleep 0.1; done")


def _submit(c: Cluster, *args: str) -> str:
    return c.submit(*ROOT_TASKS_SUBMIT, "--gpu-mem-gib", "10", "--cpu", "0.1", "--stop-grace-s", "2", *args)


def _task(c: Cluster, task_id: str, name: str = "c1") -> types_pb2.Task:
    return c.admin(name).GetTask(admin_pb2.GetTaskRequest(task_id=task_id), timeout=5)


def _node(c: Cluster, node_id: str, name: str = "c1") -> types_pb2.NodeRecord:
    return c.admin(name).GetNode(admin_pb2.GetNodeRequest(node_id=node_id), timeout=5).record


def _fences(c: Cluster, node_id: str, name: str = "c1") -> dict[int, types_pb2.GpuFence]:
    return {f.gpu_index: f for f in _node(c, node_id, name).gpu_fences}


def _held(task: types_pb2.Task) -> list[tuple[str, int]]:
    return [(na.node_id, i) for na in task.allocation.nodes for i in na.gpu_indices]


def _task_when(c: Cluster, task_id: str, check: Callable[[types_pb2.Task], object], what: str,
               name: str = "c1", timeout_s: float = 60.0) -> types_pb2.Task:
    """The task once ``check`` holds for it."""
    def ready() -> types_pb2.Task | None:
        t = _task(c, task_id, name)
        return t if check(t) else None
    found = wait_until(ready, timeout_s, what=f"{task_id}: {what}")
    assert found is not None
    return found


def _running(c: Cluster, task_id: str, name: str = "c1") -> types_pb2.Task:
    return _task_when(c, task_id, lambda t: t.state == types_pb2.TASK_STATE_RUNNING, "running", name)


def _moved_and_running(c: Cluster, task_id: str, name: str = "c1") -> types_pb2.Task:
    """The task once it runs again after its move."""
    return _task_when(c, task_id, lambda t: t.state == types_pb2.TASK_STATE_RUNNING and t.gpu_fault_moves == 1,
                      "running again after its move", name)


def _assert_moved(task: types_pb2.Task, bad: tuple[str, int]) -> None:
    """Requeued for the move: history preempted → pending → running with the reason; no restart counted."""
    assert bad not in _held(task)
    assert task.restarts == 0 and task.preemptions == 0 and task.gpu_fault_moves == 1
    states = [h.state for h in task.history]
    i = states.index(types_pb2.TASK_STATE_PREEMPTED)
    assert states[i:i + 3] == [types_pb2.TASK_STATE_PREEMPTED, types_pb2.TASK_STATE_PENDING,
                               types_pb2.TASK_STATE_SCHEDULED]
    assert f"moved off {bad[0]} GPU {bad[1]}: xid 79" in task.history[i].reason


class TestFailingGpu:
    def test_task_moves_off_the_gpu_and_resume_brings_it_back(self, cluster: Cluster, tmp_path: Path) -> None:
        """XID 79 on one GPU of a 4-GPU task on an 8-GPU node: the task has its checkpoint signal within 5 s and
        runs again on 4 healthy GPUs of the node; the node shows the GPU fenced with the reason; an 8-GPU task
        waits naming it; ``gpus resume`` brings it back and the 8-GPU task runs."""
        faults = _start(cluster, tmp_path)
        starts, ckpt = tmp_path / "starts", tmp_path / "ckpt"
        tid = _submit(cluster, "--name", "four", "--gpus", "4", "--", "sh", "-c", _script(starts, ckpt))
        bad = _held(_running(cluster, tid))[1]
        _inject(faults["n1"], gpu=bad[1], xid=79)
        wait_until(ckpt.exists, timeout_s=_MOVE_S, what="the checkpoint signal")
        task = _moved_and_running(cluster, tid)
        _assert_moved(task, bad)
        assert len(_held(task)) == 4 and {n for n, _ in _held(task)} == {"n1"}
        # Started twice (the second start writes its line once running), never counted as a restart.
        wait_until(lambda: len(starts.read_text().split()) == 2, what="the second start")
        assert starts.read_text().split() == ["0", "0"]
        assert ckpt.read_text().splitlines() == ["checkpoint 0"]  # signalled once
        fence = _fences(cluster, "n1")[bad[1]]
        assert "79" in fence.reason and fence.simulated
        assert "xid 79" in cluster.ctl("nodes", "n1").stdout
        out = cluster.ctl("-o", "json", "events", "--backlog", "1000").stdout
        events = [json.loads(line) for line in out.splitlines() if line]
        assert any(f"moved off n1 GPU {bad[1]}: xid 79" in e["message"] and e["kind"] == "health"
                   for e in events), events

        assert cluster.ctl("cancel", tid).returncode == 0
        wait_until(lambda: _task(cluster, tid).state == types_pb2.TASK_STATE_CANCELLED, what="cancelled")
        big = _submit(cluster, "--name", "eight", "--gpus", "8", "--", "sh", "-c", "sleep 1")
        _task_when(cluster, big, lambda t: f"n1 GPU {bad[1]} unhealthy: xid 79" in t.reason,
                   "waiting, naming the unhealthy GPU")
        assert _task(cluster, big).state == types_pb2.TASK_STATE_PENDING
        res = cluster.ctl("gpus", "resume", f"n1:{bad[1]}")
        assert res.returncode == 0, res.stderr
        assert bad[1] not in _fences(cluster, "n1")
        _task_when(cluster, big, lambda t: types_pb2.TASK_STATE_RUNNING in [h.state for h in t.history],
                   "the 8-GPU task ran")

    def test_leader_killed_right_after_the_fault(self, cluster: Cluster, tmp_path: Path) -> None:
        """The same with the leader killed -9 right after the injection: the standby fences the GPU and moves the
        task (once), which runs again on healthy GPUs; no GPU is held twice."""
        faults = _start(cluster, tmp_path, coordinators=("c1", "c2"), flags=("--task-grace", "3"))
        starts, ckpt = tmp_path / "starts", tmp_path / "ckpt"
        tid = _submit(cluster, "--name", "four", "--gpus", "4", "--", "sh", "-c", _script(starts, ckpt))
        bad = _held(_running(cluster, tid))[0]
        _inject(faults["n1"], gpu=bad[1], xid=79)
        cluster.proc("c1").kill()
        cluster.wait_leader("c2")
        task = _moved_and_running(cluster, tid, "c2")
        _assert_moved(task, bad)
        assert ckpt.read_text().splitlines() == ["checkpoint 0"] and len(_held(task)) == 4
        assert_gpus_held_once(list(cluster.admin("c2").ListTasks(admin_pb2.ListTasksRequest(), timeout=5).tasks))
        assert "79" in _fences(cluster, "n1", "c2")[bad[1]].reason
        res = cluster.ctl("gpus", "resume", f"n1:{bad[1]}", coordinator=cluster.address("c2"))
        assert res.returncode == 0, res.stderr
        assert bad[1] not in _fences(cluster, "n1", "c2")

    def test_application_xid_is_the_tasks_own(self, cluster: Cluster, tmp_path: Path) -> None:
        """XID 13 on a task's GPU: recorded on the task, the GPU stays in service, nothing drained, the task runs on."""
        faults = _start(cluster, tmp_path, gpus="4xH100-80GB")
        starts, ckpt = tmp_path / "starts", tmp_path / "ckpt"
        tid = _submit(cluster, "--name", "one", "--gpus", "1", "--", "sh", "-c", _script(starts, ckpt))
        [(_n, gpu)] = _held(_running(cluster, tid))
        _inject(faults["n1"], gpu=gpu, xid=13)
        task = _task_when(cluster, tid, lambda t: t.app_xids, "the XID recorded on the task")
        assert [(x.node_id, x.gpu_index, x.xid) for x in task.app_xids] == [("n1", gpu, 13)]
        assert task.state == types_pb2.TASK_STATE_RUNNING and task.gpu_fault_moves == 0
        assert [h.state for h in task.history].count(types_pb2.TASK_STATE_RUNNING) == 1
        record = _node(cluster, "n1")
        assert not record.gpu_fences and not record.draining and not record.health_drained
        assert not ckpt.exists()


class TestMovesWhole:
    def test_gang_is_requeued_whole(self, cluster: Cluster, tmp_path: Path) -> None:
        """One part's GPU fails: both parts get the checkpoint signal, and the gang runs again on both nodes
        without the failed GPU."""
        faults = _start(cluster, tmp_path, nodes=("n1", "n2"), gpus="4xH100-80GB")
        starts, ckpt = tmp_path / "starts", tmp_path / "ckpt"
        tid = _submit(cluster, "--name", "gang", "--nodes", "2", "--gpus", "2", "--",
                      "sh", "-c", _script(starts, ckpt))
        bad = next(g for g in _held(_running(cluster, tid)) if g[0] == "n2")
        _inject(faults["n2"], gpu=bad[1], xid=79)
        wait_until(lambda: ckpt.exists() and sorted(ckpt.read_text().split("\n")[:-1]) == ["checkpoint 0",
                                                                                            "checkpoint 1"],
                   timeout_s=10.0, what="both parts signalled")
        task = _moved_and_running(cluster, tid)
        _assert_moved(task, bad)
        assert sorted(na.node_id for na in task.allocation.nodes) == ["n1", "n2"]

    def test_elastic_task_shrinks_off_the_gpu(self, cluster: Cluster, tmp_path: Path) -> None:
        """A 2:4 elastic task at 4 GPUs whose GPU fails runs again at 3 on the node's healthy GPUs, a resize."""
        faults = _start(cluster, tmp_path, gpus="4xH100-80GB", flags=("--elastic-interval", "600"))
        starts, ckpt = tmp_path / "starts", tmp_path / "ckpt"
        tid = _submit(cluster, "--name", "elastic", "--kind", "training", "--gpus", "2:4", "--",
                      "sh", "-c", _script(starts, ckpt))
        held = _held(_task_when(cluster, tid, lambda t: t.state == types_pb2.TASK_STATE_RUNNING
                                and len(_held(t)) == 4, "running at 4 GPUs"))
        bad = held[2]
        _inject(faults["n1"], gpu=bad[1], xid=79)
        task = _moved_and_running(cluster, tid)
        assert sorted(_held(task)) == sorted(g for g in held if g != bad)
        assert task.restarts == 0 and task.elastic.resizes == 1 and ckpt.exists()
        assert f"moved off n1 GPU {bad[1]}: xid 79" in task.elastic.resize_reason
