"""The confinement rules of coordinator.api.tenancy, the new roles from gptrmctl certs to the
authenticator, without a server."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.errors import ConfigError, ValidationError
from common.pb.gptrm.v1 import admin_pb2, types_pb2
from coordinator.api.auth import Authenticator, AuthRefused, Principal
from coordinator.api.tenancy import REDACTED, covers, queue_change_refusal, redacted, usage_filter
from coordinator.ctl.main import main as ctl_main
from coordinator.queues import Queue, QueueConfig
from coordinator.tokens import TokenFile, new_token, token_line

# org ─┬─ a ─┬─ a1
#      │     └─ a2
#      └─ b         (members: bob);   top: a queue of its own
TREE = QueueConfig.from_dict({"queue": [
    {"name": "org", "gpus": {"*": 8}}, {"name": "a", "parent": "org", "gpus": {"*": 4}},
    {"name": "a1", "parent": "a", "gpus": {"*": 2}}, {"name": "a2", "parent": "a", "gpus": {"*": 2}},
    {"name": "b", "parent": "org", "gpus": {"*": 4}, "members": ["bob"]}, {"name": "top", "gpus": {"*": 1}}]})

ROOT = Principal("root", "admin", "token")
LEAD = Principal("lead", "queue-admin", "token", ("a",))
ALICE = Principal("alice", "submitter", "token", ("a1",))
BOB = Principal("bob", "submitter", "token")           # names no queue: b lists him
VERA = Principal("vera", "viewer", "token")


class TestCovers:
    @pytest.mark.parametrize(("who", "queues"), [
        (ROOT, {"org", "a", "a1", "a2", "b", "top"}), (LEAD, {"a", "a1", "a2"}), (ALICE, {"a1"}), (BOB, {"b"}),
        (VERA, set()), (None, {"org", "a", "a1", "a2", "b", "top"}),
    ], ids=["admin", "queue-admin", "submitter", "member", "viewer", "no-interceptor"])
    def test_what_each_role_covers(self, who: Principal | None, queues: set[str]) -> None:
        """The cluster admin covers all, a queue admin its queues and below, a submitter its named queues (or those
        listing it), a viewer none."""
        assert {q for q in TREE.names if covers(who, TREE, q)} == queues


class TestQueueChanges:
    @pytest.mark.parametrize(("who", "name", "parent", "allowed"), [
        (ROOT, "top", None, True), (ROOT, "new", None, True),
        (LEAD, "a1", "a", True), (LEAD, "a3", "a", True),      # below its own queue
        (LEAD, "a", "org", False),                             # its own queue: admin over org needed
        (LEAD, "a1", "org", False),                            # moving it out of its subtree
        (LEAD, "b", "a", False),                               # taking another team's queue in
        (LEAD, "new", None, False),                            # a new top-level queue
        (ALICE, "a1", "a", False), (BOB, "b", "org", False), (VERA, "a1", "a", False),
    ])
    def test_changing_a_queue_needs_admin_over_its_parent(self, who: Principal, name: str, parent: str | None,
                                                         allowed: bool) -> None:
        """Admin over the queue's parent now and after the change: the cluster admin, or a queue admin above."""
        refusal = queue_change_refusal(who, TREE, name, parent)
        assert (refusal is None) == allowed, refusal
        if refusal is not None:
            assert f"queue {name!r}: changing it needs admin over" in str(refusal) and refusal.principal == who.name

    def test_whose_default_a_queue_is_stays_the_cluster_admins(self) -> None:
        """A queue admin may not make a queue below its own the default of others (it would receive their
        submissions and see their secrets), nor remove one that is; the cluster admin may."""
        tree = TREE.set(Queue.from_dict({"name": "a2", "parent": "a", "gpus": {"*": 2}, "default_for": ["*"]}))
        refusal = queue_change_refusal(LEAD, TREE, "a1", "a", ("*",))
        assert refusal is not None and "default_for" in str(refusal)
        assert queue_change_refusal(LEAD, tree, "a2", "a", ("*",)) is None       # kept as it is
        assert queue_change_refusal(LEAD, tree, "a2", "a") is not None            # removed (or cleared)
        assert queue_change_refusal(ROOT, TREE, "a1", "a", ("*",)) is None


class TestRedaction:
    def _task(self, queue: str) -> types_pb2.Task:
        return types_pb2.Task(id="t-1", queue=queue, log_tail="hf_token=xyz\n",
                              spec=types_pb2.TaskSpec(name="j", env={"HF_TOKEN": "xyz", "MODE": "fast"}))

    def test_outside_the_queue_env_values_and_output_are_redacted_in_a_copy(self) -> None:
        """A viewer and another team read the names of the variables but not their values, and no output; the
        task's own team and the admin read them; the original message is never changed."""
        listing = admin_pb2.ListTasksResponse(tasks=[self._task("a1"), self._task("b")])
        for who in (VERA, BOB):
            shown = redacted(listing, who, TREE)
            task = shown.tasks[0]
            assert dict(task.spec.env) == {"HF_TOKEN": REDACTED, "MODE": REDACTED} and task.log_tail == REDACTED
        assert redacted(listing, BOB, TREE).tasks[1].spec.env["HF_TOKEN"] == "xyz"   # bob's own queue
        assert redacted(listing, ALICE, TREE).tasks[0].spec.env["HF_TOKEN"] == "xyz"
        assert redacted(listing, ROOT, TREE) is listing
        assert listing.tasks[0].spec.env["HF_TOKEN"] == "xyz" and listing.tasks[0].log_tail.startswith("hf_token")

    def test_services_and_their_replicas_are_redacted(self) -> None:
        """A service's replica template and its replicas pass through the same point."""
        view = admin_pb2.ServiceView(service=types_pb2.Service(id="s-1", spec=types_pb2.TaskSpec(
            queue="a1", env={"KEY": "v"})), replicas=[self._task("a1")])
        shown = redacted(view, VERA, TREE)
        assert shown.service.spec.env["KEY"] == REDACTED and shown.replicas[0].spec.env["HF_TOKEN"] == REDACTED
        assert redacted(admin_pb2.ClusterStatus(coordinator_id="c1"), VERA, TREE).coordinator_id == "c1"

    def test_usage_of_a_team_role_is_its_own_queues(self) -> None:
        """A team role reads its queues' usage; the admin and a viewer (a dashboard) read everyone's."""
        assert usage_filter(ROOT, TREE) is None and usage_filter(VERA, TREE) is None
        lead = usage_filter(LEAD, TREE)
        assert lead is not None and [q for q in TREE.names if lead(q)] == ["a", "a1", "a2"]


class TestRolesFromCredentials:
    def test_gptrmctl_certs_issues_team_roles_with_queues(self, tmp_path: Path) -> None:
        """`certs issue submitter|queue-admin NAME --queues` make certificates the authenticator reads as those roles:
        a submitter may cancel (its queues are the servicer's check) but not cordon; a queue-admin without queues is
        refused at issue."""
        d = tmp_path / "pki"
        for argv in (["ca", "create"], ["issue", "submitter", "bob", "--queues", "b"],
                     ["issue", "queue-admin", "lead", "--queues", "a,c"]):
            assert ctl_main(["certs", "--dir", str(d), *argv]) == 0
        assert ctl_main(["certs", "--dir", str(d), "issue", "queue-admin", "nobody"]) == 2
        a = Authenticator(tls=True)

        def ctx(stem: str) -> dict[str, list[bytes]]:
            return {"x509_pem_cert": [(d / f"{stem}.crt").read_bytes()]}
        assert a.authorize("/gptrm.v1.Admin/CancelTask", (), ctx("submitter-bob")) == \
            Principal("bob", "submitter", "certificate", ("b",))
        with pytest.raises(AuthRefused, match="CordonNode needs role admin; 'bob' has role 'submitter'"):
            a.authorize("/gptrm.v1.Admin/CordonNode", (), ctx("submitter-bob"))
        with pytest.raises(AuthRefused, match="SetQueue needs role admin or queue-admin"):
            a.authorize("/gptrm.v1.Admin/SetQueue", (), ctx("submitter-bob"))
        lead = a.authorize("/gptrm.v1.Admin/SetQueue", (), ctx("queue-admin-lead"))
        assert lead is not None and (lead.role, lead.queues) == ("queue-admin", ("a", "c"))

    def test_tokens_give_team_roles(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """`certs token NAME submitter --queues b` prints a line the token file accepts; a queue-admin line without
        queues is refused naming the line."""
        assert ctl_main(["certs", "token", "bob", "submitter", "--queues", "b"]) == 0
        out = capsys.readouterr().out
        token = out.split("token", 1)[1].split()[0]
        line = out.split("line", 1)[1].split("\n", 1)[0].strip()
        (tmp_path / "t").write_text(line + "\n")
        p = Authenticator(tls=False, tokens=TokenFile(tmp_path / "t")).authorize(
            "/gptrm.v1.Admin/PauseTask", (("authorization", f"Bearer {token}"),), None)
        assert p == Principal("bob", "submitter", "token", ("b",))
        with pytest.raises(ValidationError, match="names the queues it administers"):
            token_line("lead", "queue-admin", new_token())
        (tmp_path / "t").write_text(f"lead queue-admin {line.split()[2]}\n")
        with pytest.raises(ConfigError, match=r"t:1: queues: a queue-admin credential names the queues"):
            TokenFile(tmp_path / "t")
