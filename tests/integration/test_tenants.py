"""Tenants confined to their queues, end to end: a real coordinator with bearer tokens and an audit
file, a real agent, gptrmctl as each tenant.

Queues ``a`` (alice's), ``b`` (bob's, with a limit and a budget) and ``lab``; tokens: ``root``
(admin, the cluster admin), ``alice`` and ``bob`` (submitters of a and b), ``vera`` (viewer),
``lead`` (queue-admin of lab). Alice's task runs
with a secret in its environment and prints a line. One cluster serves the module; each test acts
on its own things (or only tries and is refused), so none depends on another.
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from coordinator.etcd_embedded import EtcdCluster
from coordinator.tokens import new_token, token_line
from tests.helpers.ctl_schema import validate
from tests.integration.harness import ROOT_TASKS_AGENT, ROOT_TASKS_SUBMIT, Cluster, wait_until

QUEUES = """
half_life_h = 1
[[queue]]
name = "a"
gpus = { "*" = 2 }
members = ["alice"]
default_for = ["alice"]
[[queue]]
name = "b"
gpus = { "*" = 1 }
limit = { "*" = 2 }
budget = { kind = "gpu_hours", amount = 10, period = "day", action = "hold" }
members = ["bob"]
default_for = ["bob"]
[[queue]]
name = "lab"
gpus = { "*" = 1 }
"""
SECRET = "supersecret123"


@dataclass
class Tenants:
    cluster: Cluster
    tokens: dict[str, str]
    audit: Path
    task: str   # alice's running task, HF_TOKEN=SECRET in its env, "alice-output" in its log

    def ctl(self, who: str, *args: str) -> Any:
        return self.cluster.ctl("--token", self.tokens[who], *args)

    def json(self, who: str, *args: str) -> Any:
        res = self.ctl(who, "-o", "json", *args)
        assert res.returncode == 0, res.stderr
        return json.loads(res.stdout)

    def records(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.audit.read_text().splitlines()]


@pytest.fixture(scope="module")
def tenants(tmp_path_factory: pytest.TempPathFactory, etcd_server: EtcdCluster) -> Iterator[Tenants]:
    tmp = tmp_path_factory.mktemp("tenants")
    toks = {who: new_token() for who in ("root", "alice", "bob", "vera", "lead")}
    (tmp / "tokens").write_text("\n".join([
        token_line("root", "admin", toks["root"]), token_line("alice", "submitter", toks["alice"], queues=("a",)),
        token_line("bob", "submitter", toks["bob"], queues=("b",)), token_line("vera", "viewer", toks["vera"]),
        token_line("lead", "queue-admin", toks["lead"], queues=("lab",))]) + "\n")
    (tmp / "queues.toml").write_text(QUEUES)
    c = Cluster(tmp, etcd_server.endpoints, f"/gptrm-test/tenants-{uuid.uuid4().hex[:8]}/")
    try:
        t = Tenants(c, toks, tmp / "audit.log", "")
        c.start_coordinator("c1", "--queues", str(tmp / "queues.toml"), "--admin-tokens", str(tmp / "tokens"),
                            "--audit-log", str(t.audit), "--usage-interval", "1")
        wait_until(lambda: t.ctl("root", "status").returncode == 0, what="c1 up")
        c.start_agent("n1", *ROOT_TASKS_AGENT)
        wait_until(lambda: t.json("root", "nodes")["nodes"], what="n1 registered")
        t.task = t.json("alice", "submit", *ROOT_TASKS_SUBMIT, "--name", "alice-job", "--cpu", "0.1", "--env",
                        f"HF_TOKEN={SECRET}", "--", "sh", "-c", "echo alice-output; exec sleep 600")["task_id"]
        wait_until(lambda: "alice-output" in t.ctl("alice", "logs", t.task).stdout, timeout_s=60,
                   what="alice's task running and printing")
        yield t
    finally:
        c.stop()


def _refused(res: Any) -> None:
    assert res.returncode == 1 and "PERMISSION_DENIED" in res.stderr, (res.returncode, res.stderr)


class TestTaskActions:
    def test_bob_cannot_read_alices_logs(self, tenants: Tenants) -> None:
        """Task output is shown to the task's queue only: bob's `logs` of alice's task is refused and shows
        nothing of it; alice reads it."""
        res = tenants.ctl("bob", "logs", tenants.task)
        _refused(res)
        assert "alice-output" not in res.stdout and "queue 'a'" in res.stderr
        assert "alice-output" in tenants.ctl("alice", "logs", tenants.task).stdout

    @pytest.mark.parametrize("action", ["pause", "resume", "cancel"])
    def test_bob_cannot_act_on_alices_task(self, tenants: Tenants, action: str) -> None:
        """Bob (submitter of b) may not pause, resume or cancel alice's task in a; it keeps running."""
        res = tenants.ctl("bob", action, tenants.task)
        _refused(res)
        assert f"task {tenants.task} is in queue 'a': 'bob' is submitter of b" in res.stderr
        assert tenants.json("root", "tasks", tenants.task)["state"] == "running"

    def test_a_submitter_acts_on_its_own_queues_tasks(self, tenants: Tenants) -> None:
        """Alice (a submitter, not a cluster admin) cancels a task of her queue."""
        task = tenants.json("alice", "submit", *ROOT_TASKS_SUBMIT, "--cpu", "0.1", "--", "sleep", "600")
        res = tenants.ctl("alice", "cancel", task["task_id"])
        assert res.returncode == 0, res.stderr
        assert tenants.json("alice", "tasks", task["task_id"])["state"] == "cancelled"


class TestQueueChanges:
    def test_bob_cannot_lift_his_own_queues_limit_and_budget(self, tenants: Tenants) -> None:
        """`queues set b --limit none --budget none` by b's own submitter is refused: changing b needs admin over
        its parent (a top-level queue: the cluster admin); b keeps its limit and budget; audited naming b."""
        res = tenants.ctl("bob", "queues", "set", "b", "--limit", "none", "--budget", "none")
        _refused(res)
        (b,) = tenants.json("vera", "queues", "b")["queues"]
        assert b["quotas"][0]["limit"] == 2 and b["budget"]["amount"] == 10
        last = [r for r in tenants.records() if r["method"] == "SetQueue"][-1]
        assert (last["principal"], last["target"], last["outcome"]) == ("bob", "b", "refused")

    def test_bob_cannot_add_himself_to_queue_a(self, tenants: Tenants) -> None:
        """Bob may not add himself to a's members (nor submit there afterwards)."""
        _refused(tenants.ctl("bob", "queues", "set", "a", "--members", "alice,bob"))
        (a,) = tenants.json("vera", "queues", "a")["queues"]
        assert a["members"] == ["alice"]
        _refused(tenants.ctl("bob", "submit", "--queue", "a", "--cpu", "0.1", "--", "true"))

    def test_a_queue_admin_manages_the_queues_below_its_own(self, tenants: Tenants) -> None:
        """lead (queue-admin of lab) creates, changes and removes lab-x below lab, but may not change lab itself."""
        for argv in (["lab-x", "--parent", "lab", "--gpus", "1", "--members", "lead"], ["lab-x", "--gpus", "0"]):
            res = tenants.ctl("lead", "queues", "set", *argv)
            assert res.returncode == 0, res.stderr
        assert tenants.json("vera", "queues", "lab-x")["queues"][0]["parent"] == "lab"
        res = tenants.ctl("lead", "queues", "set", "lab", "--gpus", "2")
        _refused(res)
        assert "changing it needs admin over the top level" in res.stderr
        assert tenants.ctl("lead", "queues", "rm", "lab-x").returncode == 0

    def test_set_queue_is_audited_with_its_queue_as_target(self, tenants: Tenants) -> None:
        """The cluster admin's SetQueue leaves an `ok` record whose target is the queue it set."""
        res = tenants.ctl("root", "queues", "set", "b", "--weight", "1")
        assert res.returncode == 0, res.stderr
        last = [r for r in tenants.records() if r["method"] == "SetQueue"][-1]
        assert (last["principal"], last["target"], last["outcome"]) == ("root", "b", "ok")


class TestClusterChanges:
    @pytest.mark.parametrize("argv", [["cordon", "n1"], ["drain", "n1"], ["policy", "set", "load-balancing"]],
                             ids=["cordon", "drain", "policy"])
    def test_a_submitter_cannot_change_the_cluster(self, tenants: Tenants, argv: list[str]) -> None:
        """Cordon, drain and the placement policy need the cluster admin's role; the node stays schedulable."""
        res = tenants.ctl("alice", *argv)
        _refused(res)
        assert "needs role admin;" in res.stderr and "'alice' has role 'submitter'" in res.stderr
        (node,) = tenants.json("root", "nodes")["nodes"]
        assert node["state"] == "ready" and not node["cordoned"]


class TestSecrets:
    def test_a_viewer_reads_no_env_values_nor_output(self, tenants: Tenants) -> None:
        """vera's `tasks T -o json` (and the human form, and the task list) shows the variable's name but not its
        value, and no log tail; the same for bob, outside queue a; alice and the cluster admin read it."""
        for who in ("vera", "bob"):
            doc = tenants.json(who, "tasks", tenants.task)
            validate(doc, "task")
            assert doc["spec"]["env"] == {"HF_TOKEN": "<redacted>"}, who
            assert "alice-output" not in doc["log_tail"]
            listed = tenants.ctl(who, "-o", "json", "tasks").stdout
            human = tenants.ctl(who, "tasks", tenants.task).stdout
            assert SECRET not in listed and SECRET not in human and "alice-job" in listed, who
        for who in ("alice", "root"):
            assert tenants.json(who, "tasks", tenants.task)["spec"]["env"] == {"HF_TOKEN": SECRET}, who


class TestUsage:
    def test_a_team_reads_its_own_queues_usage(self, tenants: Tenants) -> None:
        """Once alice's task has used something, bob's usage report (by queue or by user) has no row of queue a nor
        of alice; a viewer's has them."""
        def used_by_a(who: str, by: str, key: str) -> bool:
            return any(r["key"] == key and r["cpu_core_hours"] > 0
                       for r in tenants.json(who, "usage", "--since", "1h", "--by", by)["rows"])
        wait_until(lambda: used_by_a("root", "queue", "a"), timeout_s=30, what="usage of queue a accounted")
        assert used_by_a("vera", "queue", "a") and used_by_a("vera", "user", "alice")
        bob = tenants.json("bob", "usage", "--since", "1h")
        validate(bob, "usage")
        assert "a" not in [r["key"] for r in bob["rows"]] and [b["queue"] for b in bob["budgets"]] == ["b"]
        assert not used_by_a("bob", "user", "alice") and used_by_a("alice", "user", "alice")


class TestAudit:
    def test_refusals_are_audited_and_in_the_events(self, tenants: Tenants) -> None:
        """Each refusal leaves one `refused` record naming the principal, the method and the target, in the audit
        file and the event stream."""
        _refused(tenants.ctl("bob", "cancel", tenants.task))
        _refused(tenants.ctl("vera", "cancel", tenants.task))
        records = [(r["principal"], r["role"], r["method"], r["target"], r["outcome"]) for r in tenants.records()]
        assert records[-2:] == [("bob", "submitter", "CancelTask", tenants.task, "refused"),
                                ("vera", "viewer", "CancelTask", tenants.task, "refused")]
        res = tenants.ctl("root", "-o", "json", "events")   # one JSON document per line
        events = [e for line in res.stdout.splitlines() if (e := json.loads(line))["kind"] == "audit"]
        assert any(e["fields"].get("principal") == "bob" and e["fields"].get("outcome") == "refused"
                   and e["fields"].get("target") == tenants.task for e in events), events[-3:]


class TestServices:
    def test_replicas_carry_who_created_the_service(self, tenants: Tenants) -> None:
        """A service created by alice submits its replicas as alice; bob may not scale or cancel it."""
        res = tenants.ctl("alice", "-o", "json", "submit", "--name", "svc", "--replicas", "1:2", "--target-util",
                          "0.5", "--gpus", "1", "--gpu-mem-gib", "1", "--cpu", "0.1", *ROOT_TASKS_SUBMIT, "--",
                          sys.executable, "-c", "import time; time.sleep(600)")
        assert res.returncode == 0, res.stderr
        sid = json.loads(res.stdout)["service_id"]
        view = wait_until(lambda: (v := tenants.json("alice", "tasks", sid))["replicas"] and v, timeout_s=30,
                          what="a replica")
        assert view["submitted_by"] == "alice"
        replica = tenants.json("alice", "tasks", view["replicas"][0]["task_id"])
        assert (replica["submitted_by"], replica["queue"]) == ("alice", "a")
        _refused(tenants.ctl("bob", "scale", sid, "2"))
        _refused(tenants.ctl("bob", "cancel", sid))
        assert tenants.ctl("alice", "cancel", sid).returncode == 0


class TestOwnWork:
    def test_filters_and_bulk_cancel_touch_only_what_they_name(self, tenants: Tenants) -> None:
        """`tasks --user/--queue/--name` lists only what they name, with USER and QUEUE columns; a bulk cancel
        asks first (refused without --yes on a non-terminal stdin), cancels only the caller's tasks that the
        filter names, and counts the others it names as refused; `events --task` shows that task's only."""
        def submit(who: str, name: str) -> str:
            return str(tenants.json(who, "submit", "--name", name, "--cpu", "0.01", "--queue-unplaceable", "--",
                                    "sleep", "600")["task_id"])
        mine = [submit("alice", f"sweep-{i}") for i in range(2)]
        other = submit("alice", "keep-1")
        bobs = submit("bob", "sweep-b")
        listed = tenants.json("vera", "tasks", "--user", "alice", "--name", "sweep-*")["tasks"]
        assert sorted(t["task_id"] for t in listed) == sorted(mine)
        in_b = tenants.json("vera", "tasks", "--queue", "b", "--state", "pending,running,scheduled")
        validate(in_b, "tasks")
        assert [t["task_id"] for t in in_b["tasks"]] == [bobs]
        table = tenants.ctl("vera", "tasks", "--queue", "b").stdout.splitlines()
        assert table[0].split()[:5] == ["TASK", "NAME", "USER", "QUEUE", "STATE"]
        assert table[1].split()[:4] == [bobs, "sweep-b", "bob", "b"]

        res = tenants.ctl("alice", "cancel", "--name", "sweep-*")   # stdin is not a terminal, no --yes
        assert res.returncode == 2 and "2 task(s) would be cancelled" in res.stderr and "--yes" in res.stderr
        res = tenants.ctl("bob", "-o", "json", "cancel", "--name", "sweep-*", "--yes")
        assert res.returncode == 0, res.stderr
        done = json.loads(res.stdout)
        validate(done, "cancel")
        assert done["task_ids"] == [bobs] and done["refused"] == 2
        res = tenants.ctl("alice", "cancel", "--queue", "a", "--name", "sweep-*", "--yes")
        assert res.returncode == 0 and "2 task(s) cancelled" in res.stdout, res.stderr
        # A task already running ends CANCELLED when its agent reports it stopped.
        states = wait_until(lambda: (s := {t["task_id"]: t["state"] for t in tenants.json("root", "tasks")["tasks"]})
                            and all(s[t] == "cancelled" for t in (*mine, bobs)) and s,
                            timeout_s=30, what="the three named tasks cancelled")
        assert states[other] != "cancelled" and states[tenants.task] == "running"
        _refused(tenants.ctl("vera", "cancel", "--name", "keep-*", "--yes"))

        lines = tenants.ctl("root", "-o", "json", "events", "--task", bobs, "--backlog", "1000").stdout.splitlines()
        events = [json.loads(line) for line in lines]
        assert events and {e["task_id"] for e in events} == {bobs}
        assert tenants.ctl("alice", "cancel", other).returncode == 0


class TestSessions:
    def test_exec_is_the_tasks_queues_and_audited(self, tenants: Tenants) -> None:
        """`exec` into alice's task: bob (submitter of another queue) and vera (viewer) are refused and audited as
        such; alice's runs, returns its command's exit code, and leaves an `ok` Session record naming the task;
        with --pty the command has a terminal of its own."""
        for who in ("bob", "vera"):
            res = tenants.ctl(who, "exec", tenants.task, "--", "sh", "-c", "echo inside")
            _refused(res)
            assert "inside" not in res.stdout
        res = tenants.ctl("alice", "exec", tenants.task, "--", "sh", "-c", "echo inside; exit 7")
        assert res.returncode == 7 and res.stdout == "inside\n", res.stderr
        records = [r for r in tenants.records() if r["method"] == "Session"]
        assert [(r["principal"], r["outcome"]) for r in records[-3:]] == [("bob", "refused"), ("vera", "refused"),
                                                                          ("alice", "ok")]
        assert records[-1]["target"] == tenants.task
        res = tenants.ctl("alice", "exec", "--pty", tenants.task, "--", "sh", "-c", "tty; exit 4")
        assert res.returncode == 4 and res.stdout.startswith("/dev/pts/"), (res.stdout, res.stderr)
