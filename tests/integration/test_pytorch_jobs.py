"""Real PyTorch jobs under gptrm: real coordinator, agents and training processes (CPU build, gloo backend).

The job is ``tests/workloads/train_ddp.py`` (its docstring states its checkpoint contract). Tasks get a clean
environment, so each agent names where the hosts' launchers live with ``--task-path`` (here the venv's bin,
which holds ``torchrun`` and the ``python`` that has PyTorch), as an admin would; no spec sets ``PATH``.

PyTorch is part of the environment ``make test`` builds (pyproject's ``train`` extra): a missing PyTorch fails
these tests, it never skips them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.oci import TOOLS, build_image, libraries, missing_tools, push, registry
from tests.helpers.ports import free_port
from tests.integration.harness import BIN, ROOT_TASKS_AGENT, ROOT_TASKS_SUBMIT, Cluster, wait_until

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[1] / "workloads" / "train_ddp.py"
TASK_PATH = f"{BIN}:/usr/bin:/bin"
"""The agents' ``--task-path``: the venv's bin first (``torchrun``, ``python``), then the system's."""
STEPS, HOLD_AT = 40, 15
_RUN_S = 120.0   # torch's import is seconds of CPU per process, on a shared machine
_JOB = ("--gpu-mem-gib", "10", "--cpu", "0.1", "--stop-grace-s", "60")


@pytest.fixture(autouse=True, scope="module")
def _pytorch_installed() -> None:
    """PyTorch and torchrun in the venv the tests (and their tasks) run from: fail loudly when missing."""
    if importlib.util.find_spec("torch") is None or not (BIN / "torchrun").exists():
        pytest.fail(f"PyTorch is not installed in {sys.prefix}: these tests run real PyTorch jobs; `make test` "
                    "installs it (pyproject.toml's train extra), or `pip install torch==2.13.0`", pytrace=False)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The job run once to the end by itself, as one process: what a resized or preempted run must match."""
    out = tmp_path_factory.mktemp("reference")
    res = subprocess.run([sys.executable, str(SCRIPT), "train", "--dir", str(out), "--steps", str(STEPS)],
                         capture_output=True, text=True, timeout=_RUN_S)
    assert res.returncode == 0, res.stdout + res.stderr
    return dict(json.loads((out / "result.json").read_text()))


def _steps(out: Path) -> list[tuple[int, float, int]]:
    """(step, loss, world size) of every step a run completed, in the order they ran (a line still being written,
    without its newline yet, is not read)."""
    log = out / "steps.log"
    if not log.exists():
        return []
    rows = []
    for line in log.read_text().split("\n")[:-1]:
        step, loss, world = line.split()
        rows.append((int(step), float(loss), int(world)))
    return rows


def _held(out: Path) -> bool:
    """The job's first run completed its first HOLD_AT steps (it idles there until its signal)."""
    return len(_steps(out)) == HOLD_AT


def _wait(c: Cluster, task_id: str, out: Path, fn: Callable[[], Any], what: str) -> Any:
    """:func:`wait_until` ``fn``; a timeout names the task's state, its log's tail and the steps it logged."""
    try:
        return wait_until(fn, _RUN_S, 0.25, what)
    except AssertionError as e:
        t = c.task(task_id)
        raise AssertionError(f"{e}\ntask {task_id}: {t['state']} {t['reason']!r}\nsteps: {_steps(out)}\n"
                             f"log: {c.ctl('logs', task_id).stdout[-3000:]}") from None


def _ended(c: Cluster, task_id: str, out: Path, what: str) -> dict[str, Any]:
    return dict(_wait(c, task_id, out, lambda: c.task_in(task_id, "succeeded", "failed", "cancelled"), what))


def _same_run(result: dict[str, Any], reference: dict[str, Any]) -> None:
    """Every step's loss and the final loss as the reference's, up to the order of floating-point sums."""
    assert result["steps"] == STEPS and len(result["losses"]) == STEPS
    assert result["final_loss"] == pytest.approx(reference["final_loss"], rel=1e-9)
    assert result["losses"] == pytest.approx(reference["losses"], rel=1e-9)


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """The job's directory (its checkpoint, step log and result)."""
    out = tmp_path / "job"
    out.mkdir()
    return out


class TestPyTorchJobs:
    def test_gang_ranks_all_reduce_through_torchrun(self, cluster: Cluster, workdir: Path) -> None:
        """A 2-node gang under --launcher torchrun: torchrun on each node starts its rank, the two join one gloo
        group at rank 0's address and reserved port, and both get the same all-reduced tensor, the sum over ranks."""
        cluster.start_coordinator("c1")
        cluster.wait_leader("c1")
        cluster.start_agents(["n1", "n2"], *ROOT_TASKS_AGENT, "--task-path", TASK_PATH)
        tid = cluster.submit("--nodes", "2", "--gpus", "1", *_JOB, *ROOT_TASKS_SUBMIT, "--launcher", "torchrun",
                             "--", str(SCRIPT), "allreduce", "--dir", str(workdir))
        t = _ended(cluster, tid, workdir, "the gang to end")
        assert t["state"] == "succeeded", t
        got = [json.loads((workdir / f"allreduce-{rank}.json").read_text()) for rank in (0, 1)]
        assert [g["rank"] for g in got] == [0, 1] and {g["world_size"] for g in got} == {2}
        assert got[0]["sum"] == got[1]["sum"] == [1.0, 3.0, 5.0, 7.0]   # [0,1,2,3] + [1,2,3,4]
        # Each node ran its own rank (torchrun's RANK follows gptrm's NODE_RANK).
        for rank in (0, 1):
            out = cluster.ctl("logs", tid, "--rank", str(rank)).stdout
            assert f"train_ddp: allreduce rank={rank} world_size=2 sum=1,3,5,7" in out, out

    def test_elastic_resize_resumes_from_its_checkpoint_at_the_new_world_size(
            self, cluster: Cluster, workdir: Path, reference: dict[str, Any]) -> None:
        """An elastic 1:2 job under torchrun runs 2 ranks on an idle 2-GPU node; a 1-GPU task arrives: the job
        gets its checkpoint signal (forwarded by torchrun to its ranks), saves with torch.save and exits; it restarts
        with 1 rank, resumes from the checkpoint and ends with the losses of a run never resized."""
        cluster.start_coordinator("c1", "--elastic-interval", "2")
        cluster.wait_leader("c1")
        cluster.start_agents(["n1"], *ROOT_TASKS_AGENT, "--simulate-gpus", "2xH100-80GB", "--task-path", TASK_PATH)
        tid = cluster.submit("--name", "trainer", "--kind", "training", "--gpus", "1:2", *_JOB, *ROOT_TASKS_SUBMIT,
                             "--launcher", "torchrun", "--", str(SCRIPT), "train", "--dir", str(workdir),
                             "--steps", str(STEPS), "--hold-at", str(HOLD_AT))
        _wait(cluster, tid, workdir, lambda: _held(workdir), "the job at 2 ranks, holding")
        assert {world for _, _, world in _steps(workdir)} == {2}
        other = cluster.submit("--name", "other", "--gpus", "1", "--gpu-mem-gib", "10", "--cpu", "0.1", "--",
                               "sleep", "600")
        t = _ended(cluster, tid, workdir, "the resized job to end")
        assert t["state"] == "succeeded", t
        assert t["elastic"]["resizes"] == 1 and t["elastic"]["gpus"] == 1 and other in t["elastic"]["history"][0][
            "reason"], t["elastic"]
        steps = _steps(workdir)
        assert [s for s, _, _ in steps] == list(range(1, STEPS + 1)), steps   # each step once, none lost
        assert [w for _, _, w in steps] == [2] * HOLD_AT + [1] * (STEPS - HOLD_AT)
        _same_run(json.loads((workdir / "result.json").read_text()), reference)
        logs = cluster.ctl("logs", tid).stdout
        for line in (f"holding rank=0 step={HOLD_AT}", f"checkpoint rank=0 step={HOLD_AT} reason=SIGUSR1",
                     f"checkpoint rank=1 step={HOLD_AT} reason=SIGUSR1",
                     f"resumed rank=0 step={HOLD_AT} world_size=1 saved_world_size=2"):
            assert f"train_ddp: {line}\n" in logs, logs
        assert cluster.ctl("cancel", other).returncode == 0

    def test_preempted_job_checkpoints_resumes_and_loses_no_step(
            self, cluster: Cluster, workdir: Path, reference: dict[str, Any]) -> None:
        """A priority-0 job (one process, started as ``python`` from the task's PATH) holds the node's only GPU; a
        priority-10 task preempts it: it checkpoints on its signal and exits, waits while the other runs, then
        resumes from its checkpoint and finishes; every step ran exactly once and the losses are the reference's."""
        cluster.start_coordinator("c1")
        cluster.wait_leader("c1")
        cluster.start_agents(["n1"], *ROOT_TASKS_AGENT, "--simulate-gpus", "1xH100-80GB", "--task-path", TASK_PATH)
        tid = cluster.submit("--name", "victim", "--priority", "0", "--gpus", "1", *_JOB, *ROOT_TASKS_SUBMIT, "--",
                             "python", str(SCRIPT), "train", "--dir", str(workdir), "--steps", str(STEPS),
                             "--hold-at", str(HOLD_AT), "--checkpoint-every", "10")
        _wait(cluster, tid, workdir, lambda: _held(workdir), "the job holding")
        urgent = cluster.submit("--name", "urgent", "--priority", "10", "--gpus", "1", "--gpu-mem-gib", "10",
                                "--cpu", "0.1", "--", "true")
        t = _ended(cluster, tid, workdir, "the preempted job to end")
        assert t["state"] == "succeeded", t
        assert t["preemptions"] == 1 and cluster.task(urgent)["state"] == "succeeded"
        states = [h["state"] for h in t["history"]]
        assert states[states.index("preempted"):][:2] == ["preempted", "pending"], states
        steps = _steps(workdir)
        assert [s for s, _, _ in steps] == list(range(1, STEPS + 1)), steps
        _same_run(json.loads((workdir / "result.json").read_text()), reference)
        logs = cluster.ctl("logs", tid).stdout
        for line in ("checkpoint rank=0 step=10 reason=periodic", f"holding rank=0 step={HOLD_AT}",
                     f"checkpoint rank=0 step={HOLD_AT} reason=SIGUSR1",
                     f"resumed rank=0 step={HOLD_AT} world_size=1 saved_world_size=1"):
            assert f"train_ddp: {line}\n" in logs, logs


def _python_image(where: Path) -> Path:
    """The test image of a job in a container: a minimal image (``tests/helpers/oci.py``'s programs) plus the
    system libraries that this Python and PyTorch's native modules load, with ``PATH`` naming the venv's bin first.

    The interpreter's own tree and the venv (PyTorch's CPU build alone is about 750 MB) are not copied into a layer:
    packing, pushing, pulling and unpacking that on every run would make the test minutes long. The job mounts
    them read-only at the same paths instead (the way a site shares a software tree with its containers), so the
    image only has to carry what lies outside them."""
    prefixes = tuple(str(Path(p).resolve()) + "/" for p in (sys.prefix, sys.base_prefix))
    import torch

    site = Path(torch.__file__).parent
    binaries = [Path(sys.executable).resolve(), *site.glob("_C*.so"), *(site / "lib").glob("*.so*"),
                *(Path(sys.base_prefix) / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" /
                  "lib-dynload").glob("*.so")]
    libs = {lib for b in binaries for lib in libraries(b) if not lib.startswith(prefixes)}
    return build_image(where, extra_libraries=sorted(libs), env={"PATH": f"{BIN}:/bin"},
                       files={"/etc/passwd": "root:x:0:0:root:/tmp:/bin/sh\n"})


@pytest.mark.skipif(os.geteuid() != 0, reason="the agent must be root to run containers")
@pytest.mark.skipif(bool(missing_tools()), reason=f"needs {', '.join(TOOLS)} (SYSTEM_TEST_PACKAGES)")
def test_gang_in_an_image_all_reduces(cluster: Cluster, workdir: Path) -> None:
    """The 2-node torchrun gang of test_gang_ranks_all_reduce_through_torchrun, with ``--image``: a Python image
    built here and pushed to a registry on loopback, pulled by both agents; each rank runs inside its node's
    container (the interpreter and the venv mounted read-only at their host paths) and the ranks agree."""
    top = Path(tempfile.mkdtemp(prefix="gptrm-pytorch-image-", dir="/var/tmp"))
    top.chmod(0o755)
    try:
        with registry(top / "registry") as address:
            image = push(_python_image(top), address, "test/python:1")
            shared = [str(Path(p).resolve()) for p in (sys.base_prefix, sys.prefix)] + [str(SCRIPT.parent)]
            cluster.start_coordinator("c1", "--mount-allowed", ",".join([*shared, str(workdir)]))
            cluster.wait_leader("c1")
            port = free_port()   # a rendezvous range of this test's own
            for node in ("n1", "n2"):
                cluster.start_agent(node, *ROOT_TASKS_AGENT, "--state-dir", str(top / node),
                                    "--image-insecure-registries", address, "--task-port-range", f"{port}-{port}")
            wait_until(lambda: len(cluster.ctl_json("nodes")["nodes"]) == 2, what="two nodes registered")
            mounts = [a for p in shared for a in ("--mount", f"{p}:{p}:ro")] + ["--mount", f"{workdir}:{workdir}"]
            tid = cluster.submit("--nodes", "2", "--gpus", "1", *_JOB, *ROOT_TASKS_SUBMIT, "--image", image, *mounts,
                                 "--launcher", "torchrun", "--", str(SCRIPT), "allreduce", "--dir", str(workdir))
            t = _ended(cluster, tid, workdir, "the gang in its image to end")
            assert t["state"] == "succeeded", t
        got = [json.loads((workdir / f"allreduce-{rank}.json").read_text()) for rank in (0, 1)]
        assert [g["rank"] for g in got] == [0, 1] and {g["world_size"] for g in got} == {2}
        assert got[0]["sum"] == got[1]["sum"] == [1.0, 3.0, 5.0, 7.0]
        for rank in (0, 1):
            out = cluster.ctl("logs", tid, "--rank", str(rank)).stdout
            assert f"train_ddp: allreduce rank={rank} world_size=2 sum=1,3,5,7" in out, out
        # Each node pulled the image into its own store; each rank ran in a container (crun), not on the host.
        for node in ("n1", "n2"):
            assert cluster.agents[node].log().count('"image_pull_started"') == 1
    finally:
        shutil.rmtree(top, ignore_errors=True)
