"""gptrmctl as a subprocess against a real cluster: exit codes, ``-o json`` against the schemas, human output."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from tests.helpers.ctl_schema import validate
from tests.helpers.ports import free_port
from tests.integration.harness import BIN, Cluster, wait_until


def _json(c: Cluster, *args: str) -> Any:
    res = c.ctl("-o", "json", *args)
    assert res.returncode == 0, f"{args}: {res.stderr}"
    return json.loads(res.stdout)


def _start(c: Cluster, *agent_args: str) -> None:
    c.start_coordinator("c1")
    c.wait_leader("c1")
    c.start_agent("n1", *agent_args)
    wait_until(lambda: (n := _json(c, "nodes")["nodes"]) and n[0]["host"] is not None, what="node with telemetry")


def _submit(c: Cluster, *args: str) -> dict[str, Any]:
    doc = _json(c, "submit", *args)
    validate(doc, "task")
    return doc


class TestJsonContract:
    @pytest.mark.slow
    def test_every_command_matches_its_schema(self, cluster: Cluster) -> None:
        """Each command's -o json document validates against its schema, with numbers as numbers and zeros present."""
        _start(cluster)
        status = _json(cluster, "status")
        validate(status, "status")
        assert status["is_leader"] and isinstance(status["leader_epoch"], int)
        nodes = _json(cluster, "nodes")
        validate(nodes, "nodes")
        node = _json(cluster, "nodes", "n1")
        validate(node, "node")
        gpu0 = node["gpus"][0]
        assert gpu0["index"] == 0 and gpu0["telemetry"]["index"] == 0  # zero is present, not dropped
        assert isinstance(gpu0["mem_total_bytes"], int) and gpu0["telemetry"]["ecc_corrected_total"] == 0
        task = _submit(cluster, "--name", "j", "--gpus", "1", "--gpu-mem-gib", "1", "--cpu", "0.1", "--",
                       "sleep", "30")
        assert task["kind"] == task["spec"]["kind"] == "unspecified"
        assert isinstance(task["spec"]["demand"]["gpu_mem_bytes"], int)
        wait_until(lambda: _json(cluster, "tasks", task["task_id"])["state"] == "running", what="running")
        inference = _submit(cluster, "--name", "i", "--kind", "inference", "--gpus", "1", "--cpu", "0.1", "--",
                            "sleep", "30")
        assert inference["kind"] == inference["spec"]["kind"] == "inference"
        validate(_json(cluster, "tasks"), "tasks")
        validate(_json(cluster, "tasks", task["task_id"]), "task")
        for verb in ("pause", "resume", "cancel"):
            validate(_json(cluster, verb, task["task_id"]), "task")
        for verb in ("cordon", "uncordon", "drain"):
            validate(_json(cluster, verb, "n1"), "node")
        validate(_json(cluster, "policy", "get"), "policy")
        validate(_json(cluster, "policy", "set", "load-balancing", "--threshold", "0.8"), "policy")
        res = cluster.ctl("-o", "json", "events")
        assert res.returncode == 0, res.stderr
        events = [json.loads(line) for line in res.stdout.splitlines()]
        assert events
        for e in events:
            validate(e, "event")


class TestExitCodes:
    def test_refused_usage_and_no_coordinator(self, cluster: Cluster) -> None:
        """1 for a refused request (reason on stderr), 2 for usage errors (program named once), 3 for no answer."""
        cluster.start_coordinator("c1")
        cluster.wait_leader("c1")
        res = cluster.ctl("tasks", "no-such-task")
        assert res.returncode == 1 and "no-such-task" in res.stderr
        res = cluster.ctl("no-such-command")
        assert res.returncode == 2 and res.stderr.count("gptrmctl:") == 1
        res = subprocess.run([str(BIN / "gptrmctl"), "--insecure", "--coordinator", f"127.0.0.1:{free_port()}",
                              "--timeout", "2", "status"], capture_output=True, text=True, timeout=60)
        assert res.returncode == 3 and "no coordinator answered" in res.stderr


class TestHumanOutput:
    def test_tables_details_reasons_and_escaping(self, cluster: Cluster) -> None:
        """Tables carry units, details print no Python dicts, reasons lead with the cause, names are escaped."""
        _start(cluster)
        nodes = cluster.ctl("nodes")
        assert nodes.returncode == 0, nodes.stderr
        header, row = nodes.stdout.splitlines()[:2]
        assert header.split()[:4] == ["NODE", "STATE", "HEALTH", "GPUS"] and "GiB" in row and " W" in row and "%" in row
        assert row.split()[2] == "ok"
        detail = cluster.ctl("nodes", "n1").stdout
        assert "56 cores, 1.0 TiB memory (SIMULATED host)" in detail and "(SIMULATED GPUs)" in detail
        ok = _submit(cluster, "--name", "evil\x1b[31mred", "--gpus", "1", "--gpu-mem-gib", "10", "--cpu", "0.1",
                     "--", "sleep", "30")
        wait_until(lambda: _json(cluster, "tasks", ok["task_id"])["state"] == "running", what="running")
        text = cluster.ctl("tasks", ok["task_id"]).stdout
        assert "{" not in text and "'" not in text
        assert "demand        1 GPU × 10.0 GiB, 0.1 cores, 0 B memory" in text
        assert "kind          unspecified (profiled as inference)" in text
        assert "\x1b" not in text and "evil\\x1b[31mred" in text
        big = _submit(cluster, "--queue-unplaceable", "--name", "big", "--gpus", "1", "--cpu", "1000", "--",
                      "sleep", "30")
        wait_until(lambda: _json(cluster, "tasks", big["task_id"])["reason"], what="a pending reason")
        table = cluster.ctl("tasks").stdout
        [line] = [ln for ln in table.splitlines() if ln.startswith(big["task_id"])]
        reason = line[table.splitlines()[0].index("REASON"):]
        assert reason.startswith("cpu_cores over threshold"), reason
        assert "\x1b" not in table
        wide = cluster.ctl("-o", "wide", "tasks").stdout
        assert "KIND" in wide.splitlines()[0] and "unspecified" in wide and "1000 cores" in wide
        assert "RESERVED" in cluster.ctl("-o", "wide", "nodes").stdout
        after = cluster.ctl("tasks", "-o", "wide")   # a global option after the command, as kubectl takes it
        assert after.returncode == 0 and "KIND" in after.stdout.splitlines()[0], after.stderr
        cluster.ctl("cancel", ok["task_id"])
        cluster.ctl("cancel", big["task_id"])


class TestSubmitWait:
    def test_follows_to_final_state_and_exits_with_its_code(self, cluster: Cluster) -> None:
        """submit --wait ends when the task does, with its exit code, progress on stderr and the task on stdout."""
        _start(cluster)
        res = cluster.ctl("-o", "json", "submit", "--wait", "--name", "w", "--gpus", "1", "--cpu", "0.1", "--",
                          "sh", "-c", "sleep 1; exit 3")
        assert res.returncode == 3, res.stderr
        doc = json.loads(res.stdout)
        validate(doc, "task")
        assert doc["state"] == "failed" and doc["exit_code"] == 3
        assert "failed" in res.stderr.splitlines()[-1]
        res = cluster.ctl("submit", "--wait", "--name", "ok", "--gpus", "1", "--cpu", "0.1", "--",
                          "sh", "-c", "echo hello; echo world >&2")
        assert res.returncode == 0, res.stderr
        assert "succeeded with exit code 0" in res.stdout and "succeeded" in res.stderr
        # The task's output streamed on stdout as srun -l shows it: each line after its rank.
        assert "0: hello\n" in res.stdout and "0: world\n" in res.stdout, res.stdout


class TestCompletion:
    def _complete(self, script: str, words: list[str]) -> list[str]:
        """Run the bash completion function for ``words`` (the last one is being completed)."""
        quoted = " ".join(f"'{w}'" for w in words)
        call = f"COMP_WORDS=({quoted}); COMP_CWORD={len(words) - 1}; _gptrmctl"
        prog = f'{script}\n{call}; printf "%s\\n" "${{COMPREPLY[@]}}"'
        res = subprocess.run(["bash", "-c", prog], capture_output=True, text=True, timeout=60,
                             env={"PATH": f"{BIN}:/usr/bin:/bin", "GPTRM_INSECURE": "1"})
        assert res.returncode == 0, res.stderr
        return res.stdout.split()

    def test_bash_commands_flags_and_ids(self, cluster: Cluster) -> None:
        """The bash script completes commands, a command's flags, -o formats and the coordinator's task ids."""
        _start(cluster)
        res = cluster.ctl("completion", "bash")
        assert res.returncode == 0 and "complete -F _gptrmctl gptrmctl" in res.stdout
        script, addr = res.stdout, cluster.address()
        assert self._complete(script, ["gptrmctl", "--coordinator", addr, "ca"]) == ["cancel"]
        assert "--wait" in self._complete(script, ["gptrmctl", "submit", "--w"])
        assert self._complete(script, ["gptrmctl", "-o", "w"]) == ["wide"]
        tid = _submit(cluster, "--name", "c", "--gpus", "1", "--cpu", "0.1", "--", "sleep", "20")["task_id"]
        assert tid in self._complete(script, ["gptrmctl", "--coordinator", addr, "cancel", ""])
        assert self._complete(script, ["gptrmctl", "--coordinator", addr, "cordon", ""]) == ["-h", "--help", "n1"]
        cluster.ctl("cancel", tid)

    def test_zsh_script(self) -> None:
        """The zsh script declares itself for gptrmctl and loads the same function through bashcompinit."""
        res = subprocess.run([str(BIN / "gptrmctl"), "completion", "zsh"], capture_output=True, text=True, timeout=60)
        assert res.returncode == 0 and res.stdout.startswith("#compdef gptrmctl")
        assert "bashcompinit" in res.stdout and "_gptrmctl()" in res.stdout
        res = subprocess.run([str(BIN / "gptrmctl"), "completion", "fish"], capture_output=True, text=True, timeout=60)
        assert res.returncode == 2 and "completion: argument shell" in res.stderr


class TestPages:
    def test_lists_are_paged_filtered_and_followed(self, cluster: Cluster) -> None:
        """ListTasks answers bounded pages with a token; gptrmctl follows every page and filters by state."""
        from common.pb.gptrm.v1 import admin_pb2, types_pb2
        cluster.start_coordinator("c1")
        cluster.wait_leader("c1")
        ids = [_submit(cluster, "--name", f"p{i}", "--gpus", "1", "--cpu", "0.1", "--", "true")["task_id"]
               for i in range(5)]
        first = cluster.admin("c1").ListTasks(admin_pb2.ListTasksRequest(page_size=2), timeout=10)
        assert len(first.tasks) == 2 and first.next_page_token
        listed = _json(cluster, "tasks", "--page-size", "2")["tasks"]
        assert sorted(t["task_id"] for t in listed) == sorted(ids)
        assert len(_json(cluster, "tasks", "--state", "pending", "--page-size", "2")["tasks"]) == 5
        assert _json(cluster, "tasks", "--state", "running")["tasks"] == []
        assert cluster.ctl("tasks", "--state", "bogus").returncode == 2
        nodes = cluster.admin("c1").ListNodes(admin_pb2.ListNodesRequest(
            states=[types_pb2.NODE_STATE_READY]), timeout=10)
        assert list(nodes.nodes) == [] and not nodes.next_page_token


class TestPolicyThresholdServer:
    def test_absurd_threshold_refused_by_the_coordinator(self, cluster: Cluster) -> None:
        """SetPolicy with a threshold of 1e-300 or 2 is refused naming the threshold; the policy is unchanged."""
        import grpc

        from common.pb.gptrm.v1 import types_pb2
        cluster.start_coordinator("c1")
        cluster.wait_leader("c1")
        stub = cluster.admin("c1")
        before = _json(cluster, "policy", "get")
        for value in (1e-300, 2.0):
            try:
                stub.SetPolicy(types_pb2.Policy(name="load-balancing", threshold=value), timeout=10)
                raise AssertionError(f"threshold {value} accepted")
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "threshold" in e.details()
        assert _json(cluster, "policy", "get") == before


class TestNodesRm:
    def test_rm_refuses_live_node_and_removes_lost_one(self, cluster: Cluster) -> None:
        """`nodes rm` of a connected node exits 1 naming why; once the agent is gone and the node lost it is
        removed (exit 0, a node document) and no longer listed."""
        cluster.start_coordinator("c1", "--lost-grace", "0.5", "--lost-task-grace", "3600", "--lost-node-gc", "0")
        cluster.wait_leader("c1")
        agent = cluster.start_agent("n1")
        wait_until(lambda: [n["state"] for n in _json(cluster, "nodes")["nodes"]] == ["ready"], what="n1 ready")
        res = cluster.ctl("nodes", "rm", "n1")
        assert res.returncode == 1 and "not lost" in res.stderr, res.stderr
        agent.kill()
        wait_until(lambda: [n["state"] for n in _json(cluster, "nodes")["nodes"]] == ["lost"], what="n1 lost")
        validate(_json(cluster, "nodes", "rm", "n1"), "node")
        assert _json(cluster, "nodes")["nodes"] == []
