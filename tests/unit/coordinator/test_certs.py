"""The CA module, the token file and ``gptrmctl certs``."""

from __future__ import annotations

import datetime as dt
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from common.errors import ConfigError, GptrmError, ValidationError
from coordinator import certs, tokens
from coordinator.ctl.main import main as ctl_main


@pytest.fixture
def ca(tmp_path: Path) -> Path:
    certs.create_ca(tmp_path / "pki")
    return tmp_path / "pki"


def _forged(ca: Path, role: str, uris: list[str]) -> bytes:
    """A certificate signed by the CA in ``ca`` for ``bob`` with ``role`` and these SAN URIs, as
    another tool might write one (``certs.issue`` refuses to)."""
    ca_cert = x509.load_pem_x509_certificate((ca / "ca.crt").read_bytes())
    ca_key = serialization.load_pem_private_key((ca / "ca.key").read_bytes(), None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role),
                                     x509.NameAttribute(NameOID.COMMON_NAME, "bob")]))
            .issuer_name(ca_cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.UniformResourceIdentifier(u) for u in uris]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM)


class TestCreateCa:
    def test_ca_key_is_private_and_cert_is_a_ca(self, ca: Path) -> None:
        """The CA key is written 0600 and the certificate carries CA basic constraints."""
        assert stat.S_IMODE((ca / "ca.key").stat().st_mode) == 0o600
        cert = x509.load_pem_x509_certificate((ca / "ca.crt").read_bytes())
        assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca

    def test_existing_ca_is_never_overwritten(self, ca: Path) -> None:
        """A second ``ca create`` in the same directory fails and leaves the first key in place."""
        before = (ca / "ca.key").read_bytes()
        with pytest.raises(GptrmError, match="already exists"):
            certs.create_ca(ca)
        assert (ca / "ca.key").read_bytes() == before


class TestIssue:
    @pytest.mark.parametrize(("kind", "names", "role", "name"), [
        ("node", ["gpu01"], "node", "gpu01"),
        ("admin", ["alice"], "admin", "alice"),
        ("viewer", ["grafana"], "viewer", "grafana"),
        ("coordinator", ["coord1.example", "127.0.0.1"], "coordinator", "coord1.example"),
    ])
    def test_identity_round_trips(self, ca: Path, kind: str, names: list[str], role: str, name: str) -> None:
        """Each kind of certificate reads back as its role and principal name."""
        issued = certs.issue(ca, kind, names)
        ident = certs.identity_from_pem(issued.cert_path.read_bytes())
        assert (ident.role, ident.name) == (role, name)
        assert stat.S_IMODE(issued.key_path.stat().st_mode) == 0o600

    def test_default_lifetimes(self, ca: Path) -> None:
        """Node certificates last a year and people's certificates 90 days by default."""
        now = dt.datetime.now(dt.UTC)
        node = certs.issue(ca, "node", ["n1"])
        admin = certs.issue(ca, "admin", ["alice"])
        assert 364 <= (node.not_after - now).days <= 365
        assert 89 <= (admin.not_after - now).days <= 90

    def test_coordinator_certificate_names_every_host(self, ca: Path) -> None:
        """A coordinator certificate holds a DNS SAN per host name and an IP SAN per address."""
        issued = certs.issue(ca, "coordinator", ["c1.example", "127.0.0.1"])
        cert = x509.load_pem_x509_certificate(issued.cert_path.read_bytes())
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert san.get_values_for_type(x509.DNSName) == ["c1.example"]
        assert [str(a) for a in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]

    @pytest.mark.parametrize("bad", ["../etc", "a/b", "n1\n", "n\x00", "", " n1", "-n", "a..b"])
    def test_names_with_path_or_control_characters_are_refused(self, ca: Path, bad: str) -> None:
        """A name with path separators, control characters or whitespace is refused and nothing is written."""
        with pytest.raises(ValidationError, match="invalid name"):
            certs.issue(ca, "node", [bad])
        assert sorted(p.name for p in ca.iterdir()) == ["ca.crt", "ca.key"]

    def test_missing_ca_is_a_clear_error(self, tmp_path: Path) -> None:
        """Issuing without a CA names the missing file."""
        with pytest.raises(GptrmError, match=r"ca\.crt is missing"):
            certs.issue(tmp_path, "node", ["n1"])

    def test_negative_days_issue_an_expired_certificate(self, ca: Path) -> None:
        """``days=-1`` yields a certificate whose validity ended in the past."""
        issued = certs.issue(ca, "node", ["old"], days=-1)
        assert issued.not_after < dt.datetime.now(dt.UTC)


class TestQueues:
    def test_queues_are_san_uris_in_order_and_read_back(self, ca: Path) -> None:
        """Each queue is one urn:gptrm:queue: SAN URI, in the order given; the identity has them in that order."""
        issued = certs.issue(ca, "admin", ["bob"], queues=["shared", "ml-vision", "a0"])
        cert = x509.load_pem_x509_certificate(issued.cert_path.read_bytes())
        uris = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value \
            .get_values_for_type(x509.UniformResourceIdentifier)
        assert [u for u in uris if u.startswith("urn:gptrm:queue:")] == \
            ["urn:gptrm:queue:shared", "urn:gptrm:queue:ml-vision", "urn:gptrm:queue:a0"]
        ident = certs.identity_from_pem(issued.cert_path.read_bytes())
        assert (ident.name, ident.role, ident.queues) == ("bob", "admin", ("shared", "ml-vision", "a0"))
        viewer = certs.issue(ca, "viewer", ["eve"], queues=["shared"])
        assert certs.identity_from_pem(viewer.cert_path.read_bytes()).queues == ("shared",)

    def test_without_queues_the_identity_names_none(self, ca: Path) -> None:
        """A certificate issued without queues reads back with an empty tuple."""
        issued = certs.issue(ca, "admin", ["alice"])
        assert certs.identity_from_pem(issued.cert_path.read_bytes()).queues == ()

    @pytest.mark.parametrize("kind", ["node", "coordinator"])
    def test_node_and_coordinator_certificates_name_no_queues(self, ca: Path, kind: str) -> None:
        """Queues for a node or coordinator certificate are refused, naming the field, and nothing is written."""
        with pytest.raises(ValidationError, match="names no queues") as e:
            certs.issue(ca, kind, ["h1"], queues=["a"])
        assert e.value.field == "queues"
        assert sorted(p.name for p in ca.iterdir()) == ["ca.crt", "ca.key"]

    @pytest.mark.parametrize(("queues", "problem"), [
        (["Upper"], "invalid queue name"), (["-a"], "invalid queue name"), (["a_b"], "invalid queue name"),
        (["a" * 64], "invalid queue name"), ([""], "invalid queue name"), (["a b"], "invalid queue name"),
        (["a", "a"], "more than once"), ([f"q{i}" for i in range(33)], "at most 32"),
    ])
    def test_bad_queue_names_are_refused(self, ca: Path, queues: list[str], problem: str) -> None:
        """Queue names outside [a-z0-9][a-z0-9-]{0,62}, repeats and more than 32 queues are refused."""
        with pytest.raises(ValidationError, match=problem) as e:
            certs.issue(ca, "admin", ["bob"], queues=queues)
        assert e.value.field == "queues"

    def test_longest_name_and_most_queues_are_accepted(self, ca: Path) -> None:
        """63-character names and 32 queues are within the limits."""
        names = ["a" * 63] + [f"q{i}" for i in range(31)]
        issued = certs.issue(ca, "admin", ["bob"], queues=names)
        assert certs.identity_from_pem(issued.cert_path.read_bytes()).queues == tuple(names)

    @pytest.mark.parametrize(("role", "uris", "problem"), [
        ("admin", ["urn:gptrm:queue:ok", "urn:gptrm:queue:Bad_Queue"], "invalid queue name"),
        ("admin", ["urn:gptrm:queue:"], "invalid queue name"),
        ("admin", ["urn:gptrm:queue:a/../b"], "invalid queue name"),
        ("admin", ["urn:gptrm:queue:a", "urn:gptrm:queue:a"], "more than once"),
        ("admin", [f"urn:gptrm:queue:q{i}" for i in range(33)], "at most 32"),
        ("node", ["urn:gptrm:queue:a"], "names no queues"),
        ("queue-admin", [], "names the queues it administers"),
    ])
    def test_certificate_with_a_bad_queue_uri_is_refused(self, ca: Path, role: str, uris: list[str],
                                                          problem: str) -> None:
        """An invalid queue URI refuses the whole certificate (never a narrower or wider set of queues)."""
        pem = _forged(ca, role, [f"urn:gptrm:role:{role}", *uris])
        with pytest.raises(ValidationError, match=problem) as e:
            certs.identity_from_pem(pem)
        assert e.value.field == "certificate.queues"


class TestRevoke:
    def test_revoked_serial_is_listed_in_a_ca_signed_crl(self, ca: Path) -> None:
        """Revoking a certificate puts its serial in crl.pem, which verifies against the CA."""
        a = certs.issue(ca, "admin", ["alice"])
        b = certs.issue(ca, "admin", ["bob"])
        crl = certs.revoke(ca, a.cert_path)
        certs.revoke(ca, b.cert_path)
        assert certs.load_crl_serials(crl, (ca / "ca.crt").read_bytes()) == {a.serial, b.serial}

    def test_crl_from_another_ca_is_refused(self, ca: Path, tmp_path: Path) -> None:
        """A CRL signed by a different CA is rejected, not trusted."""
        other = tmp_path / "other"
        certs.create_ca(other)
        crl = certs.revoke(other, certs.issue(other, "node", ["x"]).cert_path)
        with pytest.raises(GptrmError, match="not signed"):
            certs.load_crl_serials(crl, (ca / "ca.crt").read_bytes())


class TestTokenFile:
    def test_lookup_and_removal(self, tmp_path: Path) -> None:
        """A listed token maps to its name and role; after its line is removed it maps to nothing."""
        t1, t2 = tokens.new_token(), tokens.new_token()
        path = tmp_path / "tokens"
        path.write_text(f"# comment\n{tokens.token_line('alice', 'admin', t1)}\n"
                        f"{tokens.token_line('eve', 'viewer', t2)}\n")
        table = tokens.TokenFile(path)
        assert table.lookup(t1) == tokens.TokenHolder("alice", "admin", ())
        assert table.lookup(t2) == tokens.TokenHolder("eve", "viewer", ())
        assert table.lookup("gptrm_wrong") is None
        path.write_text(tokens.token_line("alice", "admin", t1) + "\n# eve removed\n")
        assert table.lookup(t2) is None
        assert table.lookup(t1) == tokens.TokenHolder("alice", "admin", ())

    def test_queues_field_is_written_and_read_in_order(self, tmp_path: Path) -> None:
        """token_line writes 'queues=A,B' as a fourth field; lookup returns the queues in that order."""
        t1, t2 = tokens.new_token(), tokens.new_token()
        line = tokens.token_line("bob", "admin", t1, queues=["shared", "ml-vision"])
        assert line.split()[3] == "queues=shared,ml-vision" and len(line.split()) == 4
        assert len(tokens.token_line("eve", "viewer", t2).split()) == 3   # no queues: the old format
        path = tmp_path / "tokens"
        path.write_text(f"{line}  # bob's team\n{tokens.token_line('eve', 'viewer', t2)}\n")
        table = tokens.TokenFile(path)
        assert table.lookup(t1) == tokens.TokenHolder("bob", "admin", ("shared", "ml-vision"))
        assert table.lookup(t2) == tokens.TokenHolder("eve", "viewer", ())

    def test_token_line_refuses_bad_queues(self) -> None:
        """A bad queue name is a ValidationError naming the queues field."""
        with pytest.raises(ValidationError, match="invalid queue name") as e:
            tokens.token_line("bob", "admin", tokens.new_token(), queues=["Bad"])
        assert e.value.field == "queues"

    @pytest.mark.parametrize(("field", "problem"), [
        ("queues=", "fourth field must be"), ("queue=a", "fourth field must be"), ("a,b", "fourth field must be"),
        ("queues=a,,b", "invalid queue name"), ("queues=A", "invalid queue name"), ("queues=a,a", "more than once"),
        ("queues=" + ",".join(f"q{i}" for i in range(33)), "at most 32"),
    ])
    def test_malformed_queues_field_names_file_and_line(self, tmp_path: Path, field: str, problem: str) -> None:
        """A bad queues field stops start-up with the file and line number, like any other bad line."""
        path = tmp_path / "tokens"
        good = tokens.token_line("alice", "admin", tokens.new_token())
        path.write_text(f"{good}\n{tokens.token_line('bob', 'admin', tokens.new_token())} {field}\n")
        with pytest.raises(ConfigError, match=rf"tokens:2: .*{problem}"):
            tokens.TokenFile(path)

    def test_five_fields_are_refused(self, tmp_path: Path) -> None:
        """Anything after the queues field is not silently ignored."""
        path = tmp_path / "tokens"
        path.write_text(tokens.token_line("bob", "admin", tokens.new_token(), queues=["a"]) + " extra\n")
        with pytest.raises(ConfigError, match=r"tokens:1: expected 'NAME ROLE sha256:HEX \[queues=A,B\]'"):
            tokens.TokenFile(path)

    def test_a_broken_queues_field_at_runtime_revokes_every_token(self, tmp_path: Path) -> None:
        """A file edited into a bad queues field fails closed, as any invalid file does at runtime."""
        tok = tokens.new_token()
        path = tmp_path / "tokens"
        path.write_text(tokens.token_line("bob", "admin", tok, queues=["a"]) + "\n")
        table = tokens.TokenFile(path)
        assert table.lookup(tok) is not None
        path.write_text(tokens.token_line("bob", "admin", tok) + " queues=A,b\n")
        assert table.lookup(tok) is None

    def test_malformed_line_names_file_and_line(self, tmp_path: Path) -> None:
        """A line that is not NAME ROLE sha256:HEX stops start-up with the file and line number."""
        path = tmp_path / "tokens"
        path.write_text("alice admin plaintext-token\n")
        with pytest.raises(ConfigError, match=r"tokens:1: expected"):
            tokens.TokenFile(path)


class TestCertsCommand:
    def test_ca_issue_and_bad_name_exit_codes(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """``gptrmctl certs`` creates a CA and a node certificate (exit 0) and refuses a path-like name (exit 2)."""
        d = str(tmp_path / "pki")
        assert ctl_main(["certs", "--dir", d, "ca", "create"]) == 0
        assert ctl_main(["certs", "--dir", d, "issue", "node", "gpu01"]) == 0
        assert (tmp_path / "pki" / "node-gpu01.crt").exists()
        assert ctl_main(["certs", "--dir", d, "issue", "node", "../../etc/passwd"]) == 2
        assert "invalid name" in capsys.readouterr().err

    def test_token_prints_a_line_that_the_token_file_accepts(self, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
        """``certs token`` prints a token and the matching --admin-tokens line."""
        assert ctl_main(["certs", "token", "alice", "viewer"]) == 0
        out = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines()[:2])
        (tmp_path / "t").write_text(out["line"] + "\n")
        assert tokens.TokenFile(tmp_path / "t").lookup(out["token"]) == tokens.TokenHolder("alice", "viewer")

    def test_issue_and_token_with_queues(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """``--queues a,b`` puts the queues, in order, in the certificate and in the token's line."""
        d = str(tmp_path / "pki")
        assert ctl_main(["certs", "--dir", d, "ca", "create"]) == 0
        assert ctl_main(["certs", "--dir", d, "issue", "admin", "alice", "--queues", "team-b,team-a"]) == 0
        assert "queues team-b, team-a" in capsys.readouterr().out
        ident = certs.identity_from_pem((tmp_path / "pki" / "admin-alice.crt").read_bytes())
        assert ident.queues == ("team-b", "team-a")
        assert ctl_main(["certs", "token", "alice", "admin", "--queues", "team-a"]) == 0
        out = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines()[:2])
        assert out["line"].endswith(" queues=team-a")
        (tmp_path / "t").write_text(out["line"] + "\n")
        assert tokens.TokenFile(tmp_path / "t").lookup(out["token"]) == \
            tokens.TokenHolder("alice", "admin", ("team-a",))

    @pytest.mark.parametrize("argv", [
        ["issue", "admin", "alice", "--queues", "Team"], ["issue", "admin", "alice", "--queues", "a,,b"],
        ["issue", "node", "gpu01", "--queues", "a"], ["token", "alice", "admin", "--queues", "a,a"],
    ])
    def test_bad_queues_are_usage_errors(self, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         argv: list[str]) -> None:
        """Bad queue names, and queues on a node certificate, exit 2 naming the queues field; nothing is written."""
        d = str(tmp_path / "pki")
        assert ctl_main(["certs", "--dir", d, "ca", "create"]) == 0
        assert ctl_main(["certs", "--dir", d, *argv]) == 2
        assert "queues:" in capsys.readouterr().err
        assert sorted(p.name for p in (tmp_path / "pki").iterdir()) == ["ca.crt", "ca.key"]
