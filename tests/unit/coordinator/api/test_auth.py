"""Role rules, the authenticator's decisions and the audit file, without a server."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest

from common.errors import PermissionDenied
from coordinator import certs
from coordinator.api.audit import AuditLog
from coordinator.api.auth import Authenticator, AuthRefused, Principal, queue_refusal, required_role
from coordinator.events import EventBus
from coordinator.tokens import TokenFile, new_token, token_line


def _ctx(pki: Path, stem: str) -> dict[str, list[bytes]]:
    return {"x509_pem_cert": [(pki / f"{stem}.crt").read_bytes()]}


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    certs.create_ca(d)
    for kind, name in (("node", "n1"), ("admin", "alice"), ("viewer", "eve"), ("coordinator", "c1")):
        certs.issue(d, kind, [name])
    certs.issue(d, "admin", ["bob"], queues=["team-b", "team-c"])
    return d


class TestRequiredRole:
    @pytest.mark.parametrize(("method", "role"), [
        ("/gptrm.v1.Admin/GetStatus", "viewer"), ("/gptrm.v1.Admin/ListTasks", "viewer"),
        ("/gptrm.v1.Admin/StreamEvents", "viewer"), ("/gptrm.v1.Admin/CancelTask", "submitter"),
        ("/gptrm.v1.Admin/SetPolicy", "admin"), ("/gptrm.v1.Admin/SomethingNew", "admin"),
        ("/gptrm.v1.Admin/CordonNode", "admin"), ("/gptrm.v1.Admin/SetQueue", "queue-admin"),
        ("/gptrm.v1.Admin/TaskLogs", "submitter"),   # task output can hold secrets: not a viewer read
        ("/gptrm.v1.AgentGateway/Connect", "node"), ("/grpc.health.v1.Health/Check", None),
        ("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", "any"), ("/other.Svc/X", "admin"),
    ])
    def test_table(self, method: str, role: str | None) -> None:
        """Reads need viewer, per-task calls a submitter, queue changes a queue admin, other writes and
        unknown methods admin, the gateway a node, health nothing."""
        assert required_role(method) == role


class TestAuthenticator:
    def test_certificate_roles(self, pki: Path) -> None:
        """Admin and viewer certificates get their role; a viewer is denied writes, a node the whole Admin API."""
        a = Authenticator(tls=True)
        assert a.authorize("/gptrm.v1.Admin/CancelTask", (), _ctx(pki, "admin-alice")).name == "alice"
        assert a.authorize("/gptrm.v1.Admin/GetStatus", (), _ctx(pki, "viewer-eve")).role == "viewer"
        with pytest.raises(AuthRefused, match="needs role admin") as e:
            a.authorize("/gptrm.v1.Admin/CancelTask", (), _ctx(pki, "viewer-eve"))
        assert e.value.code == grpc.StatusCode.PERMISSION_DENIED
        with pytest.raises(AuthRefused, match="node certificates cannot call the Admin API"):
            a.authorize("/gptrm.v1.Admin/GetStatus", (), _ctx(pki, "node-n1"))
        with pytest.raises(AuthRefused, match="needs a node certificate"):
            a.authorize("/gptrm.v1.AgentGateway/Connect", (), _ctx(pki, "admin-alice"))
        assert a.authorize("/gptrm.v1.AgentGateway/Connect", (), _ctx(pki, "node-n1")).name == "n1"
        assert a.authorize("/grpc.reflection.v1alpha.ServerReflection/X", (), _ctx(pki, "node-n1")).role == "node"

    def test_tokens_and_missing_credentials(self, pki: Path, tmp_path: Path) -> None:
        """No credentials is UNAUTHENTICATED naming what to present; a token outranks a viewer certificate."""
        tok = new_token()
        (tmp_path / "t").write_text(token_line("root", "admin", tok) + "\n")
        a = Authenticator(tls=False, tokens=TokenFile(tmp_path / "t"))
        with pytest.raises(AuthRefused, match="bearer token") as e:
            a.authorize("/gptrm.v1.Admin/GetStatus", (), None)
        assert e.value.code == grpc.StatusCode.UNAUTHENTICATED
        assert a.authorize("/gptrm.v1.Admin/CancelTask", (("authorization", f"Bearer {tok}"),), None).name == "root"
        with pytest.raises(AuthRefused, match="not recognised"):
            a.authorize("/gptrm.v1.Admin/GetStatus", (("authorization", "Bearer nope"),), None)
        reflection = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
        with pytest.raises(AuthRefused):
            a.authorize(reflection, (), None)

    def test_open_mode_only_without_tls_and_tokens(self) -> None:
        """With neither TLS nor tokens every caller is an anonymous admin, and the mode says 'none'."""
        a = Authenticator(tls=False)
        assert a.open and a.mode == "none"
        assert a.authorize("/gptrm.v1.Admin/CancelTask", (), None).name == "anonymous"

    def test_certificate_with_path_characters_is_refused(self, pki: Path) -> None:
        """A certificate whose name holds path or control characters is UNAUTHENTICATED, not a node name."""
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        ca_cert = x509.load_pem_x509_certificate((pki / "ca.crt").read_bytes())
        ca_key = serialization.load_pem_private_key((pki / "ca.key").read_bytes(), None)
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "node"),
                          x509.NameAttribute(NameOID.COMMON_NAME, "../../n1\n")])
        import datetime as dt
        now = dt.datetime.now(dt.UTC)
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(ca_cert.subject).public_key(key.public_key())
                .serial_number(1).not_valid_before(now).not_valid_after(now + dt.timedelta(days=1))
                .sign(ca_key, hashes.SHA256()))  # type: ignore[arg-type]
        ctx = {"x509_pem_cert": [cert.public_bytes(serialization.Encoding.PEM)]}
        with pytest.raises(AuthRefused, match="no valid gptrm principal") as e:
            Authenticator(tls=True).authorize("/gptrm.v1.AgentGateway/Connect", (), ctx)
        assert e.value.code == grpc.StatusCode.UNAUTHENTICATED


class TestQueues:
    def test_certificate_principal_carries_its_queues(self, pki: Path) -> None:
        """A certificate's queues reach the principal in order; the first is the default."""
        p = Authenticator(tls=True).authorize("/gptrm.v1.Admin/SubmitTask", (), _ctx(pki, "admin-bob"))
        assert p == Principal("bob", "admin", "certificate", ("team-b", "team-c"))
        assert p.default_queue == "team-b" and not p.any_queue
        alice = Authenticator(tls=True).authorize("/gptrm.v1.Admin/SubmitTask", (), _ctx(pki, "admin-alice"))
        assert alice.queues == () and alice.any_queue and alice.default_queue == ""

    def test_token_queues_replace_the_certificate_queues(self, pki: Path, tmp_path: Path) -> None:
        """A token outranks the certificate it arrives with, queues included (none named: any queue)."""
        with_queues, without = new_token(), new_token()
        (tmp_path / "t").write_text(token_line("ci", "admin", with_queues, queues=["team-x"]) + "\n"
                                    + token_line("ops", "admin", without) + "\n")
        a = Authenticator(tls=True, tokens=TokenFile(tmp_path / "t"))
        method = "/gptrm.v1.Admin/SubmitTask"
        p = a.authorize(method, (("authorization", f"Bearer {with_queues}"),), _ctx(pki, "admin-bob"))
        assert p == Principal("ci", "admin", "token", ("team-x",))
        p = a.authorize(method, (("authorization", f"Bearer {without}"),), _ctx(pki, "admin-bob"))
        assert p == Principal("ops", "admin", "token", ()) and p.any_queue

    def test_open_mode_may_use_any_queue(self) -> None:
        """The open mode's anonymous admin names no queues, so it may use any."""
        p = Authenticator(tls=False).authorize("/gptrm.v1.Admin/SubmitTask", (), None)
        assert p is not None and p.any_queue and queue_refusal(p, "whatever") is None

    def test_queue_refusal(self) -> None:
        """A named queue passes; another is a PermissionDenied naming the queue, the caller and its queues."""
        bob = Principal("bob", "admin", "token", ("b", "c"))
        assert queue_refusal(bob, "c") is None
        refusal = queue_refusal(bob, "a")
        assert isinstance(refusal, PermissionDenied)
        assert str(refusal) == "queue 'a': 'bob' may submit to b, c"
        assert (refusal.principal, refusal.role) == ("bob", "admin")
        assert isinstance(queue_refusal(None, "a"), PermissionDenied)   # no admitted caller: never "any queue"


class TestAuditLog:
    def test_one_json_line_per_record_appended_and_published(self, tmp_path: Path) -> None:
        """Each record is one JSON line with the fixed keys, appended (0600), and an audit event."""
        path = tmp_path / "audit.log"
        path.write_text('{"earlier": 1}\n')
        bus = EventBus()
        log = AuditLog(path, bus, now=lambda: 1700000000.0)
        log.record(principal="alice", role="admin", method="CancelTask", target="t-1", outcome="ok")
        log.record(principal="eve", role="viewer", method="DrainNode", target="n1", outcome="refused",
                   reason="x\n" * 600)
        log.close()
        lines = path.read_text().splitlines()
        assert len(lines) == 3 and json.loads(lines[0]) == {"earlier": 1}
        rec = json.loads(lines[1])
        assert rec == {"time": "2023-11-14T22:13:20.000+00:00", "time_unix_s": 1700000000.0, "principal": "alice",
                       "role": "admin", "method": "CancelTask", "target": "t-1", "outcome": "ok", "reason": ""}
        assert len(json.loads(lines[2])["reason"]) <= 513
        assert [e.kind for e in bus.recent(10)] == ["audit", "audit"]
