"""The gptrm certificate authority: create a CA, issue certificates, read identities back.

Every certificate names one *principal* and one *role*:

- ``node``: an agent; the node name is the CN and a ``urn:gptrm:node:NAME`` SAN URI, and the
  coordinator accepts that agent's stream only for that node;
- ``admin`` (cluster admin), ``queue-admin`` (a team lead: its queues and the queues below them),
  ``submitter`` (a team member: submits to and acts on its queues' tasks) and ``viewer``
  (read-only): a person or tool calling the Admin API (``gptrmctl``); what each may do is
  ``coordinator.api.auth``'s and ``docs/tenants.md``'s;
- ``coordinator``: a coordinator (server and client auth, SAN DNS/IP for every host name), also
  usable by an etcd member or as the coordinator's etcd client certificate.

The role is the certificate's OU and, redundantly, a ``urn:gptrm:role:ROLE`` SAN URI. A
person's certificate (:data:`QUEUE_KINDS`) may also name the queues its holder may submit to, one
``urn:gptrm:queue:NAME`` SAN URI per queue, in order (the first is the holder's default queue;
see :func:`validate_queues`); a ``queue-admin`` certificate must name the queues it administers
(:func:`validate_role_queues`). Reading one back refuses the certificate when a queue URI is
invalid, rather than dropping or widening it. Keys are
ECDSA P-256, written 0600 and never overwritten. Nothing here shells out to openssl.

Example::

    ca = create_ca(Path("pki"))                       # pki/ca.crt, pki/ca.key
    node = issue(Path("pki"), "node", ["gpu01"])       # pki/node-gpu01.crt, pki/node-gpu01.key
    ident = identity_from_pem(node.cert_path.read_bytes())
    assert (ident.role, ident.name) == ("node", "gpu01")
    bob = issue(Path("pki"), "admin", ["bob"], queues=["ml-vision", "shared"])
    assert identity_from_pem(bob.cert_path.read_bytes()).queues == ("ml-vision", "shared")
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from common.errors import GptrmError, ValidationError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.types import CertificateIssuerPublicKeyTypes

__all__ = [
    "CA_CERT",
    "CA_KEY",
    "CRL_FILE",
    "KINDS",
    "LIFETIME_DAYS",
    "MAX_QUEUES",
    "QUEUE_KINDS",
    "Identity",
    "Issued",
    "create_ca",
    "identity_from_pem",
    "issue",
    "load_crl_serials",
    "revoke",
    "validate_name",
    "validate_queues",
    "validate_role_queues",
]

CA_CERT = "ca.crt"
CA_KEY = "ca.key"
CRL_FILE = "crl.pem"
QUEUE_KINDS = ("admin", "queue-admin", "submitter", "viewer")
"""The roles of people and tools (certificates and bearer tokens), highest first; they may name
queues (never nodes or coordinators)."""
KINDS = ("node", *QUEUE_KINDS, "coordinator")
LIFETIME_DAYS = {"ca": 3650, "node": 365, "coordinator": 365, **dict.fromkeys(QUEUE_KINDS, 90)}
"""Default validity per kind: a CA outlives many rotations; people's certificates expire soonest."""
MAX_QUEUES = 32
"""The most queues one credential names."""

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")
_QUEUE_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
_ROLE_URI = "urn:gptrm:role:"
_NODE_URI = "urn:gptrm:node:"
_QUEUE_URI = "urn:gptrm:queue:"
_BACKDATE = dt.timedelta(minutes=5)   # tolerate small clock skew between issuer and verifier

Clock = Callable[[], dt.datetime]
"""Returns the current time, timezone-aware (injected in tests to issue expired certificates)."""


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def validate_name(name: str, field: str = "name") -> str:
    """A node, user or host name: letters, digits, ``.``, ``_``, ``-``; no path or control characters.

    :raises ValidationError: naming ``field`` and the offending value.
    """
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name) or ".." in name:
        raise ValidationError(field, f"invalid name {name!r}: use 1-253 letters, digits, '.', '_' or '-', "
                                     "starting with a letter or digit")
    return name


def validate_queues(queues: Sequence[str], field: str = "queues") -> tuple[str, ...]:
    """Queue names as a credential holds them: each 1-63 of ``a-z``, ``0-9``, ``-`` (not starting
    with ``-``), no repeats, at most :data:`MAX_QUEUES`; the order is kept (the first is the default).

    :raises ValidationError: naming ``field`` and the offending value.
    """
    if isinstance(queues, str):
        raise ValidationError(field, f"must be a sequence of queue names, got the string {queues!r}")
    out = tuple(queues)
    if len(out) > MAX_QUEUES:
        raise ValidationError(field, f"at most {MAX_QUEUES} queues, got {len(out)}")
    for q in out:
        if not isinstance(q, str) or not _QUEUE_RE.fullmatch(q):
            raise ValidationError(field, f"invalid queue name {q!r}: use 1-63 lower-case letters, digits or '-', "
                                         "starting with a letter or digit")
    repeated = sorted({q for q in out if out.count(q) > 1})
    if repeated:
        raise ValidationError(field, f"queue {repeated[0]!r} is named more than once")
    return out


def validate_role_queues(role: str, queues: Sequence[str], field: str = "queues") -> tuple[str, ...]:
    """``queues`` as :func:`validate_queues` checks them, for a credential of ``role``: only the
    roles of :data:`QUEUE_KINDS` name queues, and a ``queue-admin`` names at least one (the queues
    it administers).

    :raises ValidationError: naming ``field``.
    """
    held = validate_queues(queues, field)
    if held and role not in QUEUE_KINDS:
        raise ValidationError(field, f"a {role} credential names no queues (only {', '.join(QUEUE_KINDS[:-1])} "
                                     f"and {QUEUE_KINDS[-1]} credentials do), got {list(held)}")
    if not held and role == "queue-admin":
        raise ValidationError(field, "a queue-admin credential names the queues it administers (--queues A,B)")
    return held


@dataclass(frozen=True, slots=True)
class Issued:
    """Paths of a certificate and its private key just written."""

    cert_path: Path
    key_path: Path
    serial: int
    not_after: dt.datetime


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a certificate says its holder is.

    ``queues``: the queues the holder may submit to, in the certificate's order (the first is the
    default); empty when the certificate names none.
    """

    name: str
    role: str
    serial: int
    not_after: dt.datetime
    fingerprint_sha256: str
    queues: tuple[str, ...] = ()


def _write_new(path: Path, data: bytes, mode: int) -> None:
    """Create ``path`` with ``mode`` (never replacing an existing file)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError:
        raise GptrmError(f"{path} already exists; remove it first to replace it") from None
    with os.fdopen(fd, "wb") as fh:
        os.fchmod(fh.fileno(), mode)   # the umask must not widen or narrow it
        fh.write(data)


def _write_pair(directory: Path, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> Issued:
    directory.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = directory / f"{stem}.crt", directory / f"{stem}.key"
    for p in (cert_path, key_path):
        if p.exists():
            raise GptrmError(f"{p} already exists; remove it first to replace it")
    _write_new(key_path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()), 0o600)
    _write_new(cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return Issued(cert_path, key_path, cert.serial_number, cert.not_valid_after_utc)


def _load_ca(ca_dir: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    try:
        cert = x509.load_pem_x509_certificate((ca_dir / CA_CERT).read_bytes())
        key = serialization.load_pem_private_key((ca_dir / CA_KEY).read_bytes(), password=None)
    except FileNotFoundError as e:
        raise GptrmError(f"CA not found: {e.filename} is missing (run `gptrmctl certs ca create` first)") from None
    except ValueError as e:
        raise GptrmError(f"CA in {ca_dir} cannot be read: {e}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise GptrmError(f"CA key in {ca_dir} is not an EC key")
    return cert, key


def create_ca(ca_dir: Path, *, common_name: str = "gptrm CA", days: int | None = None,
              now: Clock = _utcnow) -> Issued:
    """Create a self-signed CA in ``ca_dir`` (``ca.crt``, ``ca.key`` 0600); refuses to overwrite.

    :raises GptrmError: the CA files already exist.
    """
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "gptrm"),
                         x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    start = now() - _BACKDATE
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(start)
            .not_valid_after(start + dt.timedelta(days=days or LIFETIME_DAYS["ca"]))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    return _write_pair(Path(ca_dir), "ca", cert, key)


def _san(kind: str, names: Sequence[str], queues: Sequence[str] = ()) -> list[x509.GeneralName]:
    out: list[x509.GeneralName] = [x509.UniformResourceIdentifier(_ROLE_URI + kind)]
    if kind == "node":
        out.append(x509.UniformResourceIdentifier(_NODE_URI + names[0]))
    out.extend(x509.UniformResourceIdentifier(_QUEUE_URI + q) for q in queues)
    for n in names if kind in ("node", "coordinator") else ():
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(n)))
        except ValueError:
            out.append(x509.DNSName(n))
    return out


def issue(ca_dir: Path, kind: str, names: Sequence[str], *, out_dir: Path | None = None, days: int | None = None,
          now: Clock = _utcnow, queues: Sequence[str] = ()) -> Issued:
    """Issue a ``kind`` certificate signed by the CA in ``ca_dir``; writes ``KIND-NAME.crt/.key``.

    :param kind: one of :data:`KINDS`.
    :param names: the node/user name, or the coordinator's host names and IP addresses (first is the CN).
    :param days: validity (default :data:`LIFETIME_DAYS`); negative values issue already-expired
        certificates, which only tests want.
    :param queues: the queues the holder may submit to, first the default (people's roles only,
        :data:`QUEUE_KINDS`; a ``queue-admin`` names at least one); one ``urn:gptrm:queue:NAME``
        SAN URI each, in this order.
    :raises ValidationError: unknown kind, no name, a name with characters outside the allowed set,
        or queues that are invalid (:func:`validate_queues`) or given for a node or coordinator.
    :raises GptrmError: the CA is missing, or the files already exist.
    """
    if kind not in KINDS:
        raise ValidationError("kind", f"must be one of {', '.join(KINDS)}, got {kind!r}")
    if not names:
        raise ValidationError("name", "at least one name is required")
    if kind != "coordinator" and len(names) != 1:
        raise ValidationError("name", f"a {kind} certificate names exactly one principal, got {len(names)}")
    for n in names:
        validate_name(n, "host" if kind == "coordinator" else "name")
    queues = validate_role_queues(kind, queues)
    ca_cert, ca_key = _load_ca(Path(ca_dir))
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "gptrm"),
                         x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, kind),
                         x509.NameAttribute(NameOID.COMMON_NAME, names[0])])
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
    if kind == "coordinator":
        usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
    start = now() - _BACKDATE
    lifetime = dt.timedelta(days=days if days is not None else LIFETIME_DAYS[kind])
    if lifetime.total_seconds() < 0:   # an expired certificate (tests): valid in the past
        start, lifetime = start + 2 * lifetime, -lifetime
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(ca_cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(start).not_valid_after(start + lifetime)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=False, key_cert_sign=False,
                                         crl_sign=False, content_commitment=False, data_encipherment=False,
                                         key_agreement=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(x509.SubjectAlternativeName(_san(kind, names, queues)), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return _write_pair(Path(out_dir or ca_dir), f"{kind}-{names[0]}", cert, key)


def identity_from_pem(pem: bytes | str) -> Identity:
    """Read a peer certificate's principal and role (SAN URIs first, then OU and CN).

    :raises ValidationError: unreadable certificate, no role, a name outside the allowed set
        (path or control characters are never turned into a node name), or a queue URI that is
        invalid, repeated, one too many, or on a certificate whose role names no queues
        (``certificate.queues``).
    """
    try:
        cert = x509.load_pem_x509_certificate(pem.encode() if isinstance(pem, str) else pem)
    except ValueError as e:
        raise ValidationError("certificate", f"cannot be parsed: {e}") from None
    role, name = "", ""
    queues: list[str] = []
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        for uri in san.get_values_for_type(x509.UniformResourceIdentifier):
            if uri.startswith(_ROLE_URI):
                role = uri[len(_ROLE_URI):]
            elif uri.startswith(_NODE_URI):
                name = uri[len(_NODE_URI):]
            elif uri.startswith(_QUEUE_URI):
                queues.append(uri[len(_QUEUE_URI):])
    except x509.ExtensionNotFound:
        pass
    subject = cert.subject
    ous = [a.value for a in subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)]
    cns = [a.value for a in subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    role = role or (str(ous[0]) if ous else "")
    name = name or (str(cns[0]) if cns else "")
    if role not in KINDS:
        raise ValidationError("certificate.role", f"no gptrm role (OU or {_ROLE_URI}ROLE URI), got {role!r}")
    validate_name(name, "certificate.name")
    held = validate_role_queues(role, queues, "certificate.queues")
    return Identity(name=name, role=role, serial=cert.serial_number, not_after=cert.not_valid_after_utc,
                    fingerprint_sha256=cert.fingerprint(hashes.SHA256()).hex(), queues=held)


def revoke(ca_dir: Path, cert_path: Path, *, now: Clock = _utcnow, next_update_days: int = 30) -> Path:
    """Add ``cert_path``'s serial to the CA's CRL (``crl.pem``, re-signed); returns the CRL path."""
    ca_cert, ca_key = _load_ca(Path(ca_dir))
    try:
        victim = x509.load_pem_x509_certificate(Path(cert_path).read_bytes())
    except (OSError, ValueError) as e:
        raise GptrmError(f"certificate {cert_path} cannot be read: {e}") from None
    crl_path = Path(ca_dir) / CRL_FILE
    serials = load_crl_serials(crl_path, ca_cert.public_bytes(serialization.Encoding.PEM)) if crl_path.exists() \
        else set()
    serials.add(victim.serial_number)
    builder = (x509.CertificateRevocationListBuilder().issuer_name(ca_cert.subject).last_update(now())
               .next_update(now() + dt.timedelta(days=next_update_days)))
    for s in sorted(serials):
        builder = builder.add_revoked_certificate(
            x509.RevokedCertificateBuilder().serial_number(s).revocation_date(now()).build())
    crl = builder.sign(ca_key, hashes.SHA256())
    tmp = crl_path.with_suffix(".tmp")
    tmp.write_bytes(crl.public_bytes(serialization.Encoding.PEM))
    tmp.replace(crl_path)
    return crl_path


def load_crl_serials(crl_path: Path, ca_pem: bytes) -> set[int]:
    """Serial numbers revoked by the CRL at ``crl_path``, after checking the CA signed it.

    :raises GptrmError: unreadable CRL, or one not signed by the CA.
    """
    try:
        crl = x509.load_pem_x509_crl(Path(crl_path).read_bytes())
        ca_key = x509.load_pem_x509_certificate(ca_pem).public_key()
    except (OSError, ValueError) as e:
        raise GptrmError(f"CRL {crl_path} cannot be read: {e}") from None
    # A CA certificate's key signs (certificates and this CRL), so it is one of the issuer key types.
    if not crl.is_signature_valid(cast("CertificateIssuerPublicKeyTypes", ca_key)):
        raise GptrmError(f"CRL {crl_path} is not signed by the configured CA")
    return {r.serial_number for r in crl}
