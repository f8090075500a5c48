"""Trust boundaries end to end: mutual TLS, node identity, roles, tokens, audit, etcd over TLS.

Every certificate is made at test time by ``gptrmctl certs``; the coordinator, the agents and
gptrmctl are real processes on loopback.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
from pathlib import Path

import grpc
import grpc.aio
import pytest

from common.pb.gptrm.v1 import admin_pb2, admin_pb2_grpc, agent_pb2, agent_pb2_grpc, types_pb2
from coordinator import certs
from coordinator.ctl.main import main as ctl_main
from coordinator.etcd_embedded import EtcdCluster, EtcdTlsFiles
from tests.integration.harness import BIN, Cluster, wait_until


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA with coordinator, node, admin, viewer, expired certificates, and a second CA."""
    d = tmp_path_factory.mktemp("pki")
    other = d / "other"
    for argv in (["ca", "create"], ["issue", "coordinator", "127.0.0.1", "localhost"], ["issue", "node", "n1"],
                 ["issue", "node", "n2"], ["issue", "admin", "alice"], ["issue", "viewer", "eve"],
                 ["issue", "admin", "bob"], ["issue", "submitter", "sam", "--queues", "default"]):
        assert ctl_main(["certs", "--dir", str(d), *argv]) == 0
    certs.issue(d, "node", ["old"], days=-1)   # already expired: gptrmctl refuses to issue one
    for argv in (["ca", "create"], ["issue", "admin", "mallory"]):
        assert ctl_main(["certs", "--dir", str(other), *argv]) == 0
    return d


def _tls(pki: Path, stem: str, ca: Path | None = None) -> list[str]:
    return ["--tls-cert", str(pki / f"{stem}.crt"), "--tls-key", str(pki / f"{stem}.key"),
            "--tls-ca", str(ca or pki / "ca.crt")]


def _audit(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _start_tls(cluster: Cluster, pki: Path, audit: Path, *extra: str) -> str:
    addr = cluster.start_coordinator("c1", *_tls(pki, "coordinator-127.0.0.1"), "--audit-log", str(audit), *extra)
    wait_until(lambda: _status(cluster, addr, pki, "admin-alice"), what="c1 to lead over TLS")
    return addr


def _status(cluster: Cluster, addr: str, pki: Path, stem: str) -> bool:
    res = cluster.ctl(*_tls(pki, stem), "-o", "json", "status", coordinator=addr)
    return res.returncode == 0 and json.loads(res.stdout)["is_leader"]


def _nodes(cluster: Cluster, *cred: str) -> list[str]:
    res = cluster.ctl(*cred, "-o", "json", "nodes")
    return [n["node_id"] for n in json.loads(res.stdout)["nodes"]] if res.returncode == 0 else []


class TestMutualTls:
    def test_node_certificate_cannot_register_as_another_node(self, cluster: Cluster, pki: Path,
                                                              tmp_path: Path) -> None:
        """An agent holding n1's certificate is refused as n2 (PERMISSION_DENIED, audited); as n1 it registers."""
        audit = tmp_path / "audit.log"
        _start_tls(cluster, pki, audit)
        impostor = cluster.start_agent("n2", *_tls(pki, "node-n1"))
        cluster.start_agent("n1", *_tls(pki, "node-n1"))
        admin = _tls(pki, "admin-alice")
        wait_until(lambda: _nodes(cluster, *admin) == ["n1"], what="n1 registered")
        wait_until(lambda: "PERMISSION_DENIED" in impostor.log(), what="impostor refused")
        assert _nodes(cluster, *admin) == ["n1"]
        refused = [r for r in _audit(audit) if r["method"] == "Connect"]
        assert refused and all(r["outcome"] == "refused" and r["principal"] == "n1" and r["target"] == "n2"
                               for r in refused)

    def test_roles_from_certificates_and_one_audit_line_per_call(self, cluster: Cluster, pki: Path,
                                                                 tmp_path: Path) -> None:
        """A viewer certificate reads but may not cancel, set the policy or drain; a node certificate may not
        call the Admin API; an admin may; every write and refusal leaves exactly one audit line."""
        audit = tmp_path / "audit.log"
        _start_tls(cluster, pki, audit)
        viewer = _tls(pki, "viewer-eve")
        res = cluster.ctl(*viewer, "status")
        assert res.returncode == 0 and "mutual TLS" in res.stdout, res.stderr
        before = len(_audit(audit))
        for argv in (["cancel", "t-1"], ["policy", "set", "load-balancing"], ["drain", "n1"], ["logs", "t-1"]):
            res = cluster.ctl(*viewer, *argv)
            assert res.returncode == 1 and "PERMISSION_DENIED" in res.stderr and "needs role admin" in res.stderr
        res = cluster.ctl(*_tls(pki, "node-n1"), "status")
        assert res.returncode == 1 and "node certificates cannot call the Admin API" in res.stderr
        res = cluster.ctl(*_tls(pki, "admin-alice"), "policy", "set", "load-balancing")
        assert res.returncode == 0, res.stderr
        res = cluster.ctl(*_tls(pki, "admin-alice"), "logs", "t-1")   # an admin-only read: audited only if refused
        assert res.returncode == 1 and "not found" in res.stderr
        lines = _audit(audit)[before:]
        assert [(r["principal"], r["method"], r["outcome"]) for r in lines] == [
            ("eve", "CancelTask", "refused"), ("eve", "SetPolicy", "refused"), ("eve", "DrainNode", "refused"),
            ("eve", "TaskLogs", "refused"), ("n1", "GetStatus", "refused"), ("alice", "SetPolicy", "ok")]
        assert set(lines[0]) == {"time", "time_unix_s", "principal", "role", "method", "target", "outcome", "reason"}
        assert lines[-1]["target"] == "load-balancing" and lines[0]["target"] == "t-1"
        events = cluster.ctl(*viewer, "-o", "json", "events")
        assert '"kind": "audit"' in events.stdout

    def test_a_submitter_certificate_acts_on_its_queue_only(self, cluster: Cluster, pki: Path, tmp_path: Path) -> None:
        """A certificate issued by `gptrmctl certs issue submitter sam --queues default` submits to its queue and
        cancels its task there, but may not drain a node (audited as refused)."""
        audit = tmp_path / "audit.log"
        _start_tls(cluster, pki, audit)
        sam = _tls(pki, "submitter-sam")
        res = cluster.ctl(*sam, "-o", "json", "submit", "--queue-unplaceable", "--cpu", "0.1", "--", "true")
        assert res.returncode == 0, res.stderr
        task = json.loads(res.stdout)
        assert (task["queue"], task["submitted_by"]) == ("default", "sam")
        assert cluster.ctl(*sam, "cancel", task["task_id"]).returncode == 0
        res = cluster.ctl(*sam, "drain", "n1")
        assert res.returncode == 1 and "DrainNode needs role admin; 'sam' has role 'submitter'" in res.stderr
        assert [(r["principal"], r["method"], r["outcome"]) for r in _audit(audit)] == [
            ("sam", "SubmitTask", "ok"), ("sam", "CancelTask", "ok"), ("sam", "DrainNode", "refused")]

    @pytest.mark.slow
    def test_bad_certificates_are_refused_and_never_fall_back_to_plaintext(self, cluster: Cluster, pki: Path,
                                                                            tmp_path: Path) -> None:
        """Expired and wrong-CA certificates and a plaintext client get no answer and are audited as refused
        handshakes; a revoked one (CRL re-read on SIGHUP) is UNAUTHENTICATED and audited; the coordinator keeps
        serving, the agent's stream stays up."""
        audit = tmp_path / "audit.log"
        crl_ca = pki / "crl-ca"
        assert ctl_main(["certs", "--dir", str(crl_ca), "ca", "create"]) == 0
        for argv in (["issue", "coordinator", "127.0.0.1"], ["issue", "admin", "alice"], ["issue", "admin", "bob"],
                     ["issue", "node", "n1"], ["revoke", str(crl_ca / "admin-alice.crt")]):
            assert ctl_main(["certs", "--dir", str(crl_ca), *argv]) == 0
        addr = cluster.start_coordinator("c1", *_tls(crl_ca, "coordinator-127.0.0.1"), "--audit-log", str(audit),
                                         "--tls-crl", str(crl_ca / "crl.pem"))
        wait_until(lambda: _status(cluster, addr, crl_ca, "admin-bob"), what="c1 to lead")
        agent = cluster.start_agent("n1", *_tls(crl_ca, "node-n1"))
        wait_until(lambda: _nodes(cluster, *_tls(crl_ca, "admin-bob")) == ["n1"], what="n1 registered")
        expired = cluster.ctl(*_tls(pki, "node-old", crl_ca / "ca.crt"), "status")
        wrong_ca = cluster.ctl("--tls-cert", str(pki / "other" / "admin-mallory.crt"), "--tls-key",
                               str(pki / "other" / "admin-mallory.key"), "--tls-ca", str(crl_ca / "ca.crt"), "status")
        plaintext = cluster.ctl("--insecure", "status")
        for res in (expired, wrong_ca, plaintext):
            assert res.returncode == 3 and "no coordinator answered" in res.stderr, res.stderr
        revoked = cluster.ctl(*_tls(crl_ca, "admin-alice"), "status")
        assert revoked.returncode == 1 and "UNAUTHENTICATED" in revoked.stderr and "revoked" in revoked.stderr
        assert ctl_main(["certs", "--dir", str(crl_ca), "revoke", str(crl_ca / "admin-bob.crt")]) == 0
        cluster.proc("c1").signal(signal.SIGHUP)
        wait_until(lambda: "revoked" in cluster.ctl(*_tls(crl_ca, "admin-bob"), "status").stderr,
                   what="bob revoked after SIGHUP")
        refused = [r for r in _audit(audit) if r["outcome"] == "refused"]
        assert [r["principal"] for r in refused if r["method"] != "tls-handshake"][:2] == ["alice", "bob"]
        handshakes = [r["reason"] for r in refused if r["method"] == "tls-handshake"]
        assert sum("client certificate not trusted" in r for r in handshakes) >= 2, handshakes   # expired, wrong CA
        assert any("not a TLS client" in r for r in handshakes), handshakes                        # plaintext
        assert cluster.proc("c1").alive and agent.log().count("stream_connected") == 1


class TestTokens:
    def _tokens(self, tmp_path: Path) -> tuple[Path, dict[str, str]]:
        from coordinator.tokens import new_token, token_line

        toks = {"alice": new_token(), "eve": new_token()}
        path = tmp_path / "tokens"
        path.write_text(f"{token_line('alice', 'admin', toks['alice'])}\n{token_line('eve', 'viewer', toks['eve'])}\n")
        return path, toks

    def test_no_credentials_viewer_admin_and_removed_tokens(self, cluster: Cluster, tmp_path: Path) -> None:
        """Without a token gptrmctl is UNAUTHENTICATED (exit 1); a viewer token reads but is PERMISSION_DENIED on
        cancel, policy set and drain; an admin token writes; a removed token is UNAUTHENTICATED; all audited."""
        path, toks = self._tokens(tmp_path)
        audit = tmp_path / "audit.log"
        cluster.start_coordinator("c1", "--admin-tokens", str(path), "--audit-log", str(audit))
        wait_until(lambda: cluster.ctl("--token", toks["eve"], "status").returncode == 0, what="c1 up")
        res = cluster.ctl("status")
        assert res.returncode == 1 and "UNAUTHENTICATED" in res.stderr and "bearer token" in res.stderr
        res = cluster.ctl("--token", toks["eve"], "-o", "json", "status")
        assert res.returncode == 0 and json.loads(res.stdout)["insecure"] is True
        assert json.loads(res.stdout)["auth"] == "tokens"
        for argv in (["cancel", "t-1"], ["policy", "set", "load-balancing"], ["drain", "n1"]):
            res = cluster.ctl("--token", toks["eve"], *argv)
            assert res.returncode == 1 and "PERMISSION_DENIED" in res.stderr, res.stderr
        assert cluster.ctl("--token", toks["alice"], "policy", "set", "load-balancing").returncode == 0
        path.write_text("# eve removed; alice too\n")
        res = cluster.ctl("--token", toks["eve"], "status")
        assert res.returncode == 1 and "UNAUTHENTICATED" in res.stderr and "not recognised" in res.stderr
        got = [(r["principal"].split("@")[0], r["method"], r["outcome"]) for r in _audit(audit)]
        assert got == [("anonymous", "GetStatus", "refused"), ("eve", "CancelTask", "refused"),
                       ("eve", "SetPolicy", "refused"), ("eve", "DrainNode", "refused"),
                       ("alice", "SetPolicy", "ok"), ("anonymous", "GetStatus", "refused")]


class TestEtcdTls:
    def test_coordinator_talks_to_etcd_that_requires_client_certificates(self, cluster: Cluster, pki: Path,
                                                                         tmp_path: Path) -> None:
        """With --etcd-cacert/--etcd-cert/--etcd-key the coordinator leads over https://; without a client
        certificate it is refused by etcd and exits with one line."""
        files = EtcdTlsFiles(pki / "coordinator-127.0.0.1.crt", pki / "coordinator-127.0.0.1.key", pki / "ca.crt")
        with EtcdCluster(tmp_path / "etcd", tls=files) as etcd:
            url = f"https://{etcd.endpoints[0]}"
            cluster.etcd = url
            etcd_tls = ["--etcd-cacert", str(files.ca), "--etcd-cert", str(files.cert), "--etcd-key", str(files.key)]
            cluster.start_coordinator("c1", *etcd_tls)
            cluster.wait_leader("c1")
            res = subprocess.run([str(BIN / "gptrm-coordinator"), "--insecure", "--etcd", url, "--etcd-cacert",
                                  str(files.ca), "--etcd-timeout", "2", "--listen", "127.0.0.1:0", "--metrics-listen",
                                  ""], capture_output=True, text=True, timeout=60)
            assert res.returncode == 1 and "etcd not reachable" in res.stderr and "Traceback" not in res.stderr
            cluster.stop()


async def _fake_agent(address: str, node_id: str, after_welcome: list[agent_pb2.AgentMessage],
                      listen_s: float = 2.0) -> list[agent_pb2.CoordinatorMessage]:
    """Register as ``node_id`` over a raw stream, send ``after_welcome``, collect what comes back."""
    inv = types_pb2.NodeInventory(node_id=node_id, hostname="fake", cpu_cores=1)
    got: list[agent_pb2.CoordinatorMessage] = []
    async with grpc.aio.insecure_channel(address) as ch:
        call = agent_pb2_grpc.AgentGatewayStub(ch).Connect()
        await call.write(agent_pb2.AgentMessage(register=agent_pb2.Register(inventory=inv)))
        got.append(await call.read())
        for m in after_welcome:
            await call.write(m)
        try:
            while True:
                msg = await asyncio.wait_for(call.read(), timeout=listen_s)
                if msg is grpc.aio.EOF:
                    break
                got.append(msg)
        except TimeoutError:
            pass
        call.cancel()
    return got


class TestWithoutCertificates:
    def test_foreign_status_refused_and_live_node_not_taken_over(self, cluster: Cluster, tmp_path: Path) -> None:
        """A stream registered as another node cannot report a task of n1 (its state is unchanged), and a second
        registration as n1 while n1 streams is refused and receives none of n1's decisions."""
        audit = tmp_path / "audit.log"
        addr = cluster.start_coordinator("c1", "--audit-log", str(audit))
        cluster.wait_leader("c1")
        cluster.start_agent("n1")
        wait_until(lambda: _nodes(cluster) == ["n1"], what="n1 registered")
        res = cluster.ctl("-o", "json", "submit", "--name", "s", "--gpus", "1", "--gpu-mem-gib", "1", "--cpu", "0.1",
                          "--env", "SECRET_TOKEN=s3cret", "--", "sleep", "60")
        assert res.returncode == 0, res.stderr
        task_id = json.loads(res.stdout)["task_id"]

        def running() -> bool:
            out = cluster.ctl("-o", "json", "tasks", task_id)
            return out.returncode == 0 and json.loads(out.stdout)["state"] == "running"
        wait_until(running, what="task running on n1")
        status = agent_pb2.TaskStatus(task_id=task_id, state=types_pb2.TASK_STATE_SUCCEEDED, event_seq=1,
                                      has_exit_code=True, exit_code=0)
        got = asyncio.run(_fake_agent(addr, "evil", [agent_pb2.AgentMessage(task_status=status)]))
        assert got[0].HasField("welcome")
        assert any(m.HasField("event_ack") for m in got)   # consumed (so the stream goes on), not applied
        assert json.loads(cluster.ctl("-o", "json", "tasks", task_id).stdout)["state"] == "running"
        with pytest.raises(grpc.aio.AioRpcError) as err:
            asyncio.run(_fake_agent(addr, "n1", []))
        assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
        assert cluster.ctl("cancel", task_id).returncode == 0
        records = [(r["principal"], r["method"], r["target"], r["outcome"]) for r in _audit(audit)
                   if r["outcome"] == "refused"]
        assert records == [("evil", "TaskStatus", task_id, "refused"), ("n1", "Connect", "n1", "refused")]
        assert _nodes(cluster) == ["evil", "n1"]
        stub = admin_pb2_grpc.AdminStub(grpc.insecure_channel(addr))
        view = stub.GetNode(admin_pb2.GetNodeRequest(node_id="n1"), timeout=5)
        assert view.state == types_pb2.NODE_STATE_READY


class TestTaskUser:
    def test_tasks_do_not_run_as_root_by_default(self, cluster: Cluster, tmp_path: Path) -> None:
        """Under the default configuration a task's ``id -u`` is not 0 (a root agent drops to gptrm-task or
        nobody); a spec asking for root on a node that does not allow it fails with the reason."""
        cluster.start_coordinator("c1")
        cluster.wait_leader("c1")
        cluster.start_agent("n1")
        wait_until(lambda: _nodes(cluster) == ["n1"], what="n1 registered")

        def finished(task_id: str) -> dict | None:
            t = json.loads(cluster.ctl("-o", "json", "tasks", task_id).stdout)
            return t if t["state"] in ("succeeded", "failed") else None
        res = cluster.ctl("-o", "json", "submit", "--name", "who", "--gpus", "1", "--gpu-mem-gib", "1", "--cpu", "0.1",
                          "--", "sh", "-c", 'echo "uid=$(id -u)"')
        assert res.returncode == 0, res.stderr
        t = wait_until(lambda: finished(json.loads(res.stdout)["task_id"]), what="who to finish")
        assert t["state"] == "succeeded", t
        uid = int(t["log_tail"].split("uid=", 1)[1].split()[0])
        assert uid != 0
        spec = tmp_path / "root.yaml"
        spec.write_text("name: asroot\nkind: training\nargv: [id, -u]\nrun_as_user: root\n"
                        "demand: {gpus: 1, gpu_mem_bytes: 1073741824}\n")
        res = cluster.ctl("-o", "json", "submit", "-f", str(spec))
        assert res.returncode == 0, res.stderr
        t = wait_until(lambda: finished(json.loads(res.stdout)["task_id"]), what="asroot to fail")
        assert t["state"] == "failed" and "not allowed on this node" in t["reason"], t
