"""Tasks with an image (docs/containers.md), against a real registry on loopback and a root agent.

The registry is Debian's ``docker-registry`` started by the test on 127.0.0.1 with a temporary config; the test
image is built here with umoci from the host's own ``sh``, ``cat``, ``id``, ``ls`` and ``sleep`` and their
libraries (nothing is downloaded), and pushed with skopeo (``tests/helpers/oci.py``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.ctl_schema import validate
from tests.helpers.oci import MARK, TOOLS, build_image, missing_tools, push
from tests.helpers.oci import registry as serve_registry
from tests.helpers.ports import free_port
from tests.integration.harness import Cluster, wait_until

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="the agent must be root to run containers"),
    pytest.mark.skipif(bool(missing_tools()), reason=f"needs {', '.join(TOOLS)} (SYSTEM_TEST_PACKAGES)"),
]
_MARK = MARK


@pytest.fixture(scope="module")
def registry() -> Iterator[str]:
    """A docker-registry on 127.0.0.1 holding ``test/img:1``; yields its HOST:PORT."""
    top = Path(tempfile.mkdtemp(prefix="gptrm-registry-"))
    try:
        with serve_registry(top) as address:
            push(build_image(top), address, "test/img:1")
            yield address
    finally:
        shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def state_dir() -> Iterator[Path]:
    """An agent state directory whose parents any uid may traverse (like /var/lib/gptrm/agent)."""
    top = Path(tempfile.mkdtemp(prefix="gptrm-containers-", dir="/var/tmp"))
    top.chmod(0o755)
    try:
        yield top / "agent"
    finally:
        shutil.rmtree(top, ignore_errors=True)


def _start(c: Cluster, state: Path, registry: str, *agent: str, coordinator: tuple[str, ...] = ()) -> None:
    c.start_coordinator("c1", *coordinator)
    c.wait_leader("c1")
    c.start_agent("n1", "--state-dir", str(state), "--image-insecure-registries", registry, *agent)
    wait_until(lambda: c.ctl_json("nodes")["nodes"], what="node registered")


def _submit(c: Cluster, script: str, *flags: str) -> str:
    return c.ctl_json("submit", "--name", "ctr", "--gpus", "0", "--cpu", "0.1", *flags, "--",
                      "sh", "-c", script)["task_id"]


def _ended(c: Cluster, task_id: str, timeout_s: float = 90.0) -> dict[str, Any]:
    return wait_until(lambda: (t := c.ctl_json("tasks", task_id))["state"] in ("succeeded", "failed", "cancelled")
                      and t, timeout_s, what=f"{task_id} to end")


def _index(state: Path) -> dict[str, Any]:
    return json.loads((state / "images" / "index.json").read_text())["images"]


def test_task_runs_inside_its_image_as_its_uid(cluster: Cluster, state_dir: Path, registry: str) -> None:
    """The command runs in the image (its /etc/motd, its PATH), as the task's own uid, not root, and sees none of
    the host's files; its writable layer is gone when it ends."""
    _start(cluster, state_dir, registry)
    task_id = _submit(cluster, "cat /etc/motd; echo uid=$(id -u); ls /; test -e /etc/passwd || echo no-host-passwd; "
                               "echo hi > /tmp/written; cat /tmp/written",
                      "--image", f"{registry}/test/img:1", "--env", "GREETING=hello")
    task = _ended(cluster, task_id)
    out = cluster.ctl("logs", task_id).stdout
    assert task["state"] == "succeeded", (task, out)
    assert _MARK in out and "no-host-passwd" in out and "hi\n" in out
    uid = int(out.split("uid=")[1].split()[0])
    assert uid != 0
    assert not (state_dir / "tasks" / task_id / "container").exists()
    assert list(_index(state_dir)) == [f"{registry}/test/img:1"]
    # The node reports what its store now holds (pulled after it registered).
    images = wait_until(lambda: (d := cluster.ctl_json("images"))["nodes"][0]["images"] and d, 30,
                        what="the node's images reported")
    validate(images, "images")
    assert images["nodes"][0] == {"node_id": "n1", "containers": True, "images": [f"{registry}/test/img:1"]}
    assert "test/img:1" in cluster.ctl("images", "n1").stdout


def test_same_image_at_once_is_pulled_once(cluster: Cluster, state_dir: Path, registry: str) -> None:
    """Two tasks asking for an image the node lacks, together: one pull, one unpacked tree, both run."""
    _start(cluster, state_dir, registry)
    ids = [_submit(cluster, "sleep 1; cat /etc/motd", "--image", f"{registry}/test/img:1") for _ in range(2)]
    for task_id in ids:
        assert _ended(cluster, task_id)["state"] == "succeeded"
    log = cluster.agents["n1"].log()
    assert log.count('"image_pull_started"') == 1, log[-3000:]
    assert len(os.listdir(state_dir / "images" / "rootfs")) == 1


def test_bad_reference_fails_with_the_registry_error(cluster: Cluster, state_dir: Path, registry: str) -> None:
    """An image the registry does not have: the task ends FAILED with the registry's own words."""
    _start(cluster, state_dir, registry)
    task = _ended(cluster, _submit(cluster, "true", "--image", f"{registry}/test/missing:9"))
    assert task["state"] == "failed"
    assert "manifest unknown" in task["reason"], task["reason"]


def test_mounts_only_below_allowed_roots(cluster: Cluster, state_dir: Path, registry: str, tmp_path: Path) -> None:
    """A mount below the cluster's allowed root is seen read-only inside; one elsewhere is refused at submit naming
    the mount; a link planted below the allowed root is refused by the agent."""
    allowed = Path(tempfile.mkdtemp(prefix="gptrm-allowed-", dir="/var/tmp"))
    try:
        allowed.chmod(0o755)
        (allowed / "data").mkdir()
        (allowed / "data" / "f").write_text("shared-data\n")
        (allowed / "data" / "f").chmod(0o644)
        (allowed / "data").chmod(0o755)
        os.symlink("/etc", allowed / "link")
        _start(cluster, state_dir, registry, coordinator=("--mount-allowed", str(allowed)))
        image = f"{registry}/test/img:1"
        ok = _submit(cluster, "cat /data/f; echo x > /data/g || echo read-only", "--image", image,
                     "--mount", f"{allowed}/data:/data:ro")
        task = _ended(cluster, ok)
        out = cluster.ctl("logs", ok).stdout
        assert task["state"] == "succeeded", (task, out)
        assert "shared-data" in out and "read-only" in out
        refused = cluster.ctl("submit", "--gpus", "0", "--image", image, "--mount", "/etc:/host-etc", "--", "true")
        assert refused.returncode != 0 and "spec.mounts[0]" in refused.stderr
        linked = _ended(cluster, _submit(cluster, "cat /x/passwd", "--image", image, "--mount", f"{allowed}/link:/x"))
        assert linked["state"] == "failed" and "symbolic link" in linked["reason"], linked["reason"]
        # A queue's own root: its tasks may mount below it, other queues' may not.
        team_dir = allowed.parent / (allowed.name + "-team")
        team_dir.mkdir(mode=0o755)
        (team_dir / "t").write_text("team-data\n")
        (team_dir / "t").chmod(0o644)
        for queue, roots in (("team", str(team_dir)), ("others", "")):
            res = cluster.ctl("queues", "set", queue, "--gpus", "4", "--members", "*", "--mount-allowed", roots)
            assert res.returncode == 0, res.stderr
        doc = cluster.ctl_json("queues", "team")
        validate(doc, "queues")
        assert doc["queues"][0]["mount_allowed"] == [str(team_dir)]
        mine = _submit(cluster, "cat /t/t", "--queue", "team", "--image", image, "--mount", f"{team_dir}:/t:ro")
        assert _ended(cluster, mine)["state"] == "succeeded"
        assert "team-data" in cluster.ctl("logs", mine).stdout
        theirs = cluster.ctl("submit", "--queue", "others", "--gpus", "0", "--image", image, "--mount",
                             f"{team_dir}:/t:ro", "--", "true")
        assert theirs.returncode != 0 and "spec.mounts[0]" in theirs.stderr
    finally:
        shutil.rmtree(allowed, ignore_errors=True)
        shutil.rmtree(allowed.parent / (allowed.name + "-team"), ignore_errors=True)


def test_cancel_reaches_every_process_of_the_container(cluster: Cluster, state_dir: Path, registry: str) -> None:
    """A container whose command starts children that ignore SIGTERM and leave its process group: a cancel ends
    it, and nothing of it is left running (the module's fixture checks no task uid runs afterwards too)."""
    _start(cluster, state_dir, registry)
    task_id = _submit(cluster, "trap '' TERM; (trap '' TERM; sleep 4711) & sh -c 'trap \"\" TERM; sleep 4711' & "
                               "echo started; wait", "--image", f"{registry}/test/img:1", "--stop-grace-s", "1")
    wait_until(lambda: "started" in cluster.ctl("logs", task_id).stdout, 60, what="the container's children")
    uid = int(cluster.ctl_json("tasks", task_id).get("uid", 0) or 0)
    assert cluster.ctl("cancel", task_id).returncode == 0
    task = _ended(cluster, task_id)
    assert task["state"] == "cancelled"
    import psutil

    def none_left() -> bool:
        return not [p for p in psutil.process_iter(["cmdline", "uids"])
                    if p.info["cmdline"] == ["sleep", "4711"] and (not uid or p.info["uids"].real == uid)]

    wait_until(none_left, 30, what="every process of the container gone")


def test_eviction_under_the_cap(registry: str, tmp_path: Path) -> None:
    """With a cap below two images, pulling the second evicts the first (no task holds it); a held one stays."""
    import asyncio

    from agent.images.store import ImageStore
    from common.oci import parse_image

    top = Path(tempfile.mkdtemp(prefix="gptrm-evict-"))
    try:
        layout = build_image(top)
        subprocess.run(["umoci", "config", "--image", f"{layout}:t", "--tag", "t2", "--config.env", "V=2"],
                       check=True, capture_output=True)
        subprocess.run(["skopeo", "copy", "--dest-tls-verify=false", f"oci:{layout}:t2",
                        f"docker://{registry}/test/img:2"], check=True, capture_output=True)
    finally:
        shutil.rmtree(top, ignore_errors=True)

    async def scenario() -> tuple[list[str], list[str]]:
        store = ImageStore(tmp_path / "images", skopeo=shutil.which("skopeo") or "", umoci=shutil.which("umoci") or "",
                           insecure=(registry,))
        one = await store.acquire(parse_image(f"{registry}/test/img:1"), "a")
        store.max_bytes = one.bytes + 1    # room for one image only
        store.release("a")
        await store.acquire(parse_image(f"{registry}/test/img:2"), "b")
        after_evict = [i.ref for i in store.images()]
        await store.acquire(parse_image(f"{registry}/test/img:1"), "c")   # b still holds img:2: it stays
        return after_evict, [i.ref for i in store.images()]

    after_evict, both = asyncio.run(scenario())
    assert after_evict == [f"{registry}/test/img:2"]
    assert sorted(both) == [f"{registry}/test/img:1", f"{registry}/test/img:2"]


def test_pulling_is_shown_and_a_cancel_reaches_it(cluster: Cluster, state_dir: Path, registry: str) -> None:
    """A registry that never answers: the task shows `pulling` in its reason while the node's decisions still flow,
    and a cancel ends it CANCELLED without it ever starting."""
    import socket

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    hung = f"127.0.0.1:{silent.getsockname()[1]}"
    try:
        _start(cluster, state_dir, f"{registry},{hung}")
        task_id = _submit(cluster, "true", "--image", f"{hung}/test/img:1")
        wait_until(lambda: "pulling" in cluster.ctl_json("tasks", task_id).get("reason", ""), 60,
                   what="the task to show its pull")
        other = _submit(cluster, "cat /etc/motd", "--image", f"{registry}/test/img:1")
        assert _ended(cluster, other)["state"] == "succeeded"   # the hung pull holds nothing else up
        assert cluster.ctl("cancel", task_id).returncode == 0
        task = _ended(cluster, task_id)
        assert task["state"] == "cancelled", task
        assert not (state_dir / "tasks" / task_id / "exit_code").exists()
    finally:
        silent.close()


def test_a_gang_runs_in_its_image_with_its_ranks(cluster: Cluster, state_dir: Path, registry: str) -> None:
    """A 2-node task with an image: each part's container gets its rank, MASTER_ADDR and MASTER_PORT, and rank 0's
    container holds the master port's listening socket at the fd GPTRM_MASTER_LISTEN_FD names."""
    cluster.start_coordinator("c1")
    cluster.wait_leader("c1")
    port = free_port()   # a rendezvous range of this test's own: other suites on the host use the default one
    for node in ("n1", "n2"):
        cluster.start_agent(node, "--state-dir", str(state_dir.parent / node), "--image-insecure-registries",
                            registry, "--task-port-range", f"{port}-{port}")
    wait_until(lambda: len(cluster.ctl_json("nodes")["nodes"]) == 2, what="two nodes registered")
    task_id = cluster.ctl_json(
        "submit", "--name", "gang", "--nodes", "2", "--gpus", "1", "--cpu", "0.1", "--image", f"{registry}/test/img:1",
        "--", "sh", "-c", "echo rank=$NODE_RANK of=$NNODES master=$MASTER_ADDR:$MASTER_PORT "
                          "fd=${GPTRM_MASTER_LISTEN_FD:-none} gpus=$CUDA_VISIBLE_DEVICES; "
                          "if [ -n \"$GPTRM_MASTER_LISTEN_FD\" ]; then ls -l /proc/self/fd/$GPTRM_MASTER_LISTEN_FD; fi"
    )["task_id"]
    task = _ended(cluster, task_id)
    assert task["state"] == "succeeded", task
    rank0 = cluster.ctl("logs", task_id, "--rank", "0").stdout
    rank1 = cluster.ctl("logs", task_id, "--rank", "1").stdout
    assert "rank=0 of=2 master=127.0.0.1:" in rank0 and "socket:" in rank0, rank0
    assert "rank=1 of=2 master=127.0.0.1:" in rank1 and "fd=none" in rank1, rank1
    assert "gpus=GPU-" in rank0 and "gpus=GPU-" in rank1


def test_a_flood_from_a_container_is_bounded(cluster: Cluster, state_dir: Path, registry: str) -> None:
    """50 MB written from inside a container: what the node keeps is bounded by --task-log-max-mib, and the newest
    line is kept (the container's output goes through the task's FIFO like any task's)."""
    _start(cluster, state_dir, registry, "--task-log-max-mib", "1")
    task_id = _submit(cluster, "head -c 50000000 /dev/zero | tr '\\0' 'x'; echo; echo the-last-line",
                      "--image", f"{registry}/test/img:1")
    task = _ended(cluster, task_id, timeout_s=180)
    assert task["state"] == "succeeded", task
    logs = state_dir / "tasks" / task_id
    kept = sum((logs / n).stat().st_size for n in ("output.log", "output.log.1") if (logs / n).exists())
    assert kept <= 1 << 20, kept
    assert cluster.ctl("logs", task_id, "--tail", "1").stdout == "the-last-line\n"


def test_pause_and_resume_reach_the_container(cluster: Cluster, state_dir: Path, registry: str) -> None:
    """Pause stops the container's own processes (not only crun and the wrapper); resume lets them run again."""
    import psutil

    _start(cluster, state_dir, registry)
    task_id = _submit(cluster, "sleep 4713", "--image", f"{registry}/test/img:1", "--stop-grace-s", "1")

    def sleeper() -> psutil.Process | None:
        found = [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", "4713"]]
        return found[0] if found else None

    proc = wait_until(sleeper, 60, what="the container's process")
    assert cluster.ctl("pause", task_id).returncode == 0
    wait_until(lambda: proc.status() == psutil.STATUS_STOPPED, 30, what="the container's process stopped")
    assert cluster.ctl("resume", task_id).returncode == 0
    wait_until(lambda: proc.status() != psutil.STATUS_STOPPED, 30, what="the container's process running again")
    assert cluster.ctl("cancel", task_id).returncode == 0
    assert _ended(cluster, task_id)["state"] == "cancelled"


def test_images_pull_fetches_ahead_of_tasks(cluster: Cluster, state_dir: Path, registry: str) -> None:
    """`gptrmctl images pull REF --nodes N` fills the node's store before any task asks; a task then starts from it
    without another pull. An unknown node is refused."""
    _start(cluster, state_dir, registry)
    image = f"{registry}/test/img:1"
    doc = cluster.ctl_json("images", "pull", image, "--nodes", "n1")
    validate(doc, "image_pull")
    assert doc == {"image": image, "nodes": ["n1"]}
    wait_until(lambda: cluster.ctl_json("images", "n1")["nodes"][0]["images"] == [image], 60,
               what="the image pulled ahead")
    task_id = _submit(cluster, "cat /etc/motd", "--image", image)
    assert _ended(cluster, task_id)["state"] == "succeeded"
    assert cluster.agents["n1"].log().count('"image_pull_started"') == 1
    refused = cluster.ctl("images", "pull", image, "--nodes", "nope")
    assert refused.returncode != 0 and "nope" in refused.stderr


def test_a_container_sees_only_its_own(cluster: Cluster, state_dir: Path, registry: str,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside its container a task sees no other task's processes (not their argv), none of the agent's
    environment, a /dev of the runtime's standard nodes only (no GPU of another task), and a /dev/shm sized by its
    memory demand."""
    monkeypatch.setenv("AGENT_ONLY_TOKEN", "agent-secret-value")
    _start(cluster, state_dir, registry)
    image = f"{registry}/test/img:1"
    first = _submit(cluster, "exec sh -c 'sleep 4712; :' --password=hunter2", "--image", image, "--stop-grace-s", "1")
    try:
        wait_until(lambda: cluster.ctl_json("tasks", first)["state"] == "running", 60, what="the first task")
        second = _submit(cluster, "echo DEV: $(ls /dev); cat /proc/mounts | while read -r dev dir rest; do "
                                  "[ \"$dir\" = /dev/shm ] && echo SHM: $rest; done; cat /proc/self/environ; echo; "
                                  "cat /proc/[0-9]*/cmdline",
                         "--image", image, "--mem-gib", str(64 / 1024), "--env", "FROM_SPEC=yes")
        assert _ended(cluster, second)["state"] == "succeeded"
        out = cluster.ctl("logs", second).stdout
        assert "hunter2" not in out and "4712" not in out and "gptrm-task" not in out, out
        assert "agent-secret-value" not in out and "FROM_SPEC=yes" in out, out
        dev = set(out.split("DEV:", 1)[1].split("\n", 1)[0].split())
        assert dev <= {"null", "zero", "full", "random", "urandom", "tty", "ptmx", "pts", "shm", "mqueue", "console",
                       "fd", "stdin", "stdout", "stderr", "core"}, dev
        assert "size=65536k" in out.split("SHM:", 1)[1].split("\n", 1)[0], out
    finally:
        cluster.ctl("cancel", first)
        _ended(cluster, first)


def test_a_cdi_spec_gives_the_container_its_own_gpus_driver(cluster: Cluster, state_dir: Path, registry: str,
                                                             tmp_path: Path) -> None:
    """With a CDI spec (JSON) in the agent's --cdi-spec-dirs, a task's container gets the spec's driver mount and
    variables, and the device node of its own GPU only (the simulated GPUs' nodes stand in as /dev/null)."""
    driver = Path(tempfile.mkdtemp(prefix="gptrm-driver-", dir="/var/tmp"))
    try:
        driver.chmod(0o755)
        (driver / "libcuda.so.1").write_text("driver-library\n")
        (driver / "libcuda.so.1").chmod(0o644)
        cdi = tmp_path / "cdi"
        cdi.mkdir()
        (cdi / "nvidia.json").write_text(json.dumps({
            "cdiVersion": "0.5.0", "kind": "nvidia.com/gpu",
            "containerEdits": {"env": ["DRIVER_MARK=from-cdi"],
                               "mounts": [{"hostPath": str(driver), "containerPath": "/usr/lib/driver",
                                           "options": ["ro", "nosuid", "nodev", "bind"]}]},
            "devices": [{"name": str(i), "containerEdits": {"deviceNodes": [
                {"path": f"/dev/nvidia{i}", "hostPath": "/dev/null"}]}} for i in range(4)]}))
        _start(cluster, state_dir, registry, "--cdi-spec-dirs", str(cdi))
        task_id = cluster.ctl_json("submit", "--name", "cdi", "--gpus", "1", "--cpu", "0.1", "--image",
                                   f"{registry}/test/img:1", "--", "sh", "-c",
                                   "echo gpu=$GPTRM_GPU_INDICES mark=$DRIVER_MARK; cat /usr/lib/driver/libcuda.so.1; "
                                   "echo DEV: $(ls /dev)")["task_id"]
        task = _ended(cluster, task_id)
        out = cluster.ctl("logs", task_id).stdout
        assert task["state"] == "succeeded", (task, out)
        gpu = out.split("gpu=", 1)[1].split()[0]
        assert "mark=from-cdi" in out and "driver-library" in out, out
        nodes = [n for n in out.split("DEV:", 1)[1].split() if n.startswith("nvidia")]
        assert nodes == [f"nvidia{gpu}"], out
    finally:
        shutil.rmtree(driver, ignore_errors=True)


def test_placement_prefers_a_node_holding_the_image(cluster: Cluster, state_dir: Path, registry: str) -> None:
    """Two equal empty nodes: once the second holds the image (pulled ahead), a task with that image goes there."""
    cluster.start_coordinator("c1")
    cluster.wait_leader("c1")
    for node in ("n1", "n2"):
        cluster.start_agent(node, "--state-dir", str(state_dir.parent / node), "--image-insecure-registries",
                            registry)
    wait_until(lambda: len(cluster.ctl_json("nodes")["nodes"]) == 2, what="two nodes registered")
    image = f"{registry}/test/img:1"
    cluster.ctl_json("images", "pull", image, "--nodes", "n2")
    wait_until(lambda: cluster.ctl_json("images", "n2")["nodes"][0]["images"] == [image], 60,
               what="n2 holding the image")
    task_id = _submit(cluster, "true", "--image", image)
    task = _ended(cluster, task_id)
    assert task["state"] == "succeeded"
    assert [a["node_id"] for a in task["allocation"]] == ["n2"], task["allocation"]
