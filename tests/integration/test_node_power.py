"""End to end: the Resource Adaptor powers idle nodes off through an operator command and wakes one for a task."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.harness import Cluster, wait_until

# The operator's provider command: power_off kills the node's agent, power_on starts it again.
PROVIDER = '''#!{python}
import json, os, signal, subprocess, sys, time
req = json.load(sys.stdin)
state = {state!r}
with open(os.path.join(state, "requests.log"), "a") as f:
    f.write(json.dumps(req) + "\\n")
node = req["node_id"]
pid_file = os.path.join(state, node + ".pid")
if req["action"] == "power_off":
    try:
        os.kill(int(open(pid_file).read()), signal.SIGKILL)
    except ProcessLookupError:   # asked again after a leader change: already off
        pass
    time.sleep({off_delay_s})
elif req["action"] == "power_on":
    argv = json.load(open(os.path.join(state, node + ".argv")))
    log = open(os.path.join(state, node + ".log"), "ab")
    p = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
    open(pid_file, "w").write(str(p.pid))
print(json.dumps({{"accepted": True}}))
'''


def _nodes(c: Cluster) -> dict[str, dict]:
    res = c.ctl("-o", "json", "nodes")
    assert res.returncode == 0, res.stderr
    return {n["node_id"]: n for n in json.loads(res.stdout)["nodes"]}


def _requests(state: Path) -> list[dict]:
    log = state / "requests.log"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _provider(tmp_path: Path, off_delay_s: float) -> tuple[Path, Path]:
    """The provider script (stops and starts agent processes) and its state directory."""
    state = tmp_path / "provider"
    state.mkdir()
    script = tmp_path / "provider.py"
    script.write_text(PROVIDER.format(python=sys.executable, state=str(state), off_delay_s=off_delay_s))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script, state


def _start_three_agents(cluster: Cluster, state: Path) -> None:
    """Agents n1..n3, each recorded for the provider script (how to start it again, which pid to stop)."""
    for node in ("n1", "n2", "n3"):
        proc = cluster.start_agent(node)
        (state / f"{node}.argv").write_text(json.dumps(proc.argv))
        (state / f"{node}.pid").write_text(str(proc.pid))
    wait_until(lambda: len(_nodes(cluster)) == 3, what="three nodes")


def _off(cluster: Cluster) -> list[str]:
    return sorted(n for n, d in _nodes(cluster).items() if d["power_state"] == "off")


def _kill_provided(state: Path) -> None:
    """Kill every agent the provider script knows of (started by the test or powered on by the script)."""
    for pid_file in state.glob("*.pid"):
        with contextlib.suppress(ProcessLookupError, ValueError):   # already gone
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


@contextlib.contextmanager
def _power_managed(cluster: Cluster, tmp_path: Path, *, spare_nodes: int) -> Iterator[Path]:
    """c1 leading with the provider command (a node idle 5 s powers off, ``spare_nodes`` kept on) and agents
    n1..n3; yields the provider's state directory and kills its agents at the end."""
    script, state = _provider(tmp_path, off_delay_s=0)
    cluster.start_coordinator("c1", "--node-provider", "command", "--node-provider-command", str(script),
                              "--power-down-after", "5", "--spare-nodes", str(spare_nodes), "--lost-grace", "2",
                              "--wake-timeout", "60")
    cluster.wait_leader("c1")
    try:
        _start_three_agents(cluster, state)
        yield state
    finally:
        _kill_provided(state)


class TestNodePower:
    def test_idle_nodes_power_off_and_one_wakes_for_a_gang_task(self, cluster: Cluster, tmp_path: Path) -> None:
        """Two of three idle nodes go off through the command (never lost); a 2-node task wakes one and runs."""
        with _power_managed(cluster, tmp_path, spare_nodes=1) as state:
            powered_off = wait_until(lambda: x if len(x := _off(cluster)) == 2 else None, timeout_s=60,
                                     what="two nodes off")
            assert sorted(r["node_id"] for r in _requests(state) if r["action"] == "power_off") == powered_off
            assert all(not cluster.agents[n].alive for n in powered_off)
            # Well past --lost-grace: a powered-off node is expected to be silent, never lost.
            wait_until(lambda: all(_nodes(cluster)[n]["state"] == "not-ready" for n in powered_off), timeout_s=20,
                       what="off nodes not ready")
            status = json.loads(cluster.ctl("-o", "json", "status").stdout)
            assert status["nodes_by_state"].get("off") == 2 and "lost" not in status["nodes_by_state"]
            assert "not-ready (off)" in cluster.ctl("nodes").stdout

            res = cluster.ctl("-o", "json", "submit", "--name", "gang", "--nodes", "2", "--gpus", "3",
                              "--gpu-mem-gib", "10", "--cpu", "0.1", "--", "sleep", "30")
            assert res.returncode == 0, res.stderr
            tid = json.loads(res.stdout)["task_id"]

            def running() -> dict | None:
                t = json.loads(cluster.ctl("-o", "json", "tasks", tid).stdout)
                return t if t["state"] == "running" else None

            task = wait_until(running, timeout_s=90, interval_s=0.5, what="gang task running")
            woken = [r for r in _requests(state) if r["action"] == "power_on"]
            assert len(woken) == 1 and woken[0]["node_id"] in powered_off and tid in woken[0]["reason"]
            placed = sorted(a["node_id"] for a in task["allocation"])
            assert woken[0]["node_id"] in placed and len(placed) == 2
            nodes = _nodes(cluster)
            assert nodes[woken[0]["node_id"]]["power_state"] == "ready"
            assert [n for n in powered_off if n != woken[0]["node_id"]] == _off(cluster)
            events = [json.loads(line) for line in cluster.ctl("-o", "json", "events").stdout.splitlines()]
            power = [e["message"] for e in events if e["kind"] == "power"]
            assert sum("powering-off → off" in m for m in power) == 2
            assert sum("off → powering-on" in m for m in power) == 1

    def test_tasks_held_back_keep_no_node_on(self, cluster: Cluster, tmp_path: Path) -> None:
        """Tasks that cannot start within the wake time (a start time an hour ahead, a dependency on it) are not
        waiting work: every idle node powers off, and nothing is woken for them."""
        with _power_managed(cluster, tmp_path, spare_nodes=0) as state:
            held: list[str] = []
            for extra in (("--begin", "+1h"), ("--after", "ok:{first}")):
                argv = [a.format(first=held[0]) if held else a for a in extra]
                res = cluster.ctl("-o", "json", "submit", "--name", "later", "--gpus", "1", "--gpu-mem-gib", "10",
                                  "--cpu", "0.1", *argv, "--", "sleep", "30")
                assert res.returncode == 0, res.stderr
                held.append(json.loads(res.stdout)["task_id"])

            wait_until(lambda: _off(cluster) == ["n1", "n2", "n3"], timeout_s=90, interval_s=0.5,
                       what="every node off")
            assert not [r for r in _requests(state) if r["action"] == "power_on"]
            for tid in held:
                task = json.loads(cluster.ctl("-o", "json", "tasks", tid).stdout)
                assert task["state"] == "pending", task

    @pytest.mark.slow
    def test_leader_killed_between_power_off_and_power_on(self, cluster: Cluster, tmp_path: Path) -> None:
        """The leader is killed (-9) while a node is powering-off: the standby resumes, the node ends off (never
        stuck switching), and a 2-node task then wakes one node and runs."""
        script, state = _provider(tmp_path, off_delay_s=3)
        flags = ("--node-provider", "command", "--node-provider-command", str(script), "--power-down-after", "5",
                 "--spare-nodes", "1", "--lost-grace", "2", "--wake-timeout", "60", "--lease-ttl", "2")
        cluster.start_coordinator("c1", *flags)
        cluster.wait_leader("c1")
        cluster.start_coordinator("c2", *flags)
        try:
            _start_three_agents(cluster, state)

            def power(coordinator: str) -> dict[str, str]:
                res = cluster.ctl("-o", "json", "nodes", coordinator=cluster.address(coordinator))
                return {n["node_id"]: n["power_state"] for n in json.loads(res.stdout)["nodes"]} \
                    if res.returncode == 0 else {}

            def with_power(label: str, coordinator: str) -> list[str]:
                return sorted(n for n, p in power(coordinator).items() if p == label)

            switching = wait_until(lambda: with_power("powering-off", "c1"), timeout_s=60, interval_s=0.2,
                                   what="a node powering off")
            cluster.proc("c1").signal(signal.SIGKILL)
            cluster.wait_leader("c2", timeout_s=30)

            def off() -> list[str]:
                return with_power("off", "c2")

            powered_off = wait_until(lambda: x if len(x := off()) == 2 else None, timeout_s=90, what="two nodes off")
            assert switching[0] in powered_off
            events = cluster.ctl("-o", "json", "events", coordinator=cluster.address("c2")).stdout.splitlines()
            resumed = [e for e in map(json.loads, events) if e["kind"] == "power" and e["node_id"] == switching[0]
                       and "resumed after a leader change" in e["message"]]
            assert resumed, "the new leader did not resume the interrupted power-off"
            assert with_power("powering-off", "c2") == [] and with_power("powering-on", "c2") == []
            assert all(not cluster.agents[n].alive for n in powered_off)

            res = cluster.ctl("-o", "json", "submit", "--name", "gang", "--nodes", "2", "--gpus", "3", "--gpu-mem-gib",
                              "10", "--cpu", "0.1", "--", "sleep", "30", coordinator=cluster.address("c2"))
            assert res.returncode == 0, res.stderr
            tid = json.loads(res.stdout)["task_id"]

            def running() -> dict | None:
                t = json.loads(cluster.ctl("-o", "json", "tasks", tid, coordinator=cluster.address("c2")).stdout)
                return t if t["state"] == "running" else None

            task = wait_until(running, timeout_s=90, interval_s=0.5, what="gang task running")
            woken = [r for r in _requests(state) if r["action"] == "power_on"]
            assert len(woken) == 1 and woken[0]["node_id"] in powered_off
            assert woken[0]["node_id"] in sorted(a["node_id"] for a in task["allocation"])
            end = power("c2")
            assert sorted(end.values()) == ["off", "ready", "ready"] and end[woken[0]["node_id"]] == "ready"
        finally:
            _kill_provided(state)

