"""gRPC's own TLS for gptrm: mutual TLS between agents, coordinators and gptrmctl.

Plaintext is never a fallback: a process either has all three of ``--tls-cert``,
``--tls-key`` and ``--tls-ca``, or was started with an explicit ``--insecure`` (see
:func:`tls_files`). Certificates are re-read on SIGHUP (:meth:`ServerTls.reload`,
:meth:`ClientTls.reload`): new handshakes use the new files, open streams are left alone.

Example::

    files = tls_files(insecure=cfg.insecure, cert=cfg.tls_cert, key=cfg.tls_key, ca=cfg.tls_ca)
    server_tls = ServerTls(files)
    server.add_secure_port(cfg.listen, server_tls.credentials())
    loop.add_signal_handler(signal.SIGHUP, server_tls.reload)
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

import grpc

from common.errors import ConfigError

__all__ = ["ClientTls", "ServerTls", "TlsFiles", "tls_files"]


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """Paths of a certificate chain, its private key and the CA bundle that verifies peers."""

    cert: str
    key: str
    ca: str

    def read(self, prefix: str = "tls") -> tuple[bytes, bytes, bytes]:
        """(certificate chain, private key, CA bundle) as bytes.

        :raises ConfigError: naming the setting and the file that cannot be read or is not PEM.
        """
        out = []
        for name, path in (("cert", self.cert), ("key", self.key), ("ca", self.ca)):
            try:
                data = Path(path).expanduser().read_bytes()
            except OSError as e:
                raise ConfigError(f"{prefix}_{name}: cannot read {path!r}: {e.strerror}") from None
            if b"-----BEGIN " not in data:
                raise ConfigError(f"{prefix}_{name}: {path!r} is not a PEM file")
            out.append(data)
        return out[0], out[1], out[2]


def tls_files(*, insecure: bool, cert: str, key: str, ca: str, prefix: str = "tls") -> TlsFiles | None:
    """Check the TLS settings of a process: all three files, or ``insecure`` and none.

    :returns: the files, or None for an explicitly insecure (plaintext) process.
    :raises ConfigError: a partial set, both TLS and insecure, or neither.
    """
    given = {f"{prefix}_cert": cert, f"{prefix}_key": key, f"{prefix}_ca": ca}
    missing = [k for k, v in given.items() if not v]
    if insecure:
        if len(missing) < 3:
            raise ConfigError(f"insecure: cannot be combined with {', '.join(k for k, v in given.items() if v)}")
        return None
    if missing:
        raise ConfigError(f"{', '.join(missing)}: required for TLS (plaintext needs an explicit --insecure)")
    files = TlsFiles(cert, key, ca)
    files.read(prefix)   # fail at start-up, naming the file, rather than at the first handshake
    return files


class ServerTls:
    """Server credentials that require and verify client certificates, reloadable without a restart.

    :param files: server certificate, key and the CA that client certificates must chain to.
    """

    def __init__(self, files: TlsFiles) -> None:
        self.files = files
        self._lock = threading.Lock()
        self._pending: grpc.ServerCertificateConfiguration | None = None
        self._initial = self._configuration()

    def _configuration(self) -> grpc.ServerCertificateConfiguration:
        cert, key, ca = self.files.read()
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)

    def credentials(self) -> grpc.ServerCredentials:
        """Credentials for ``add_secure_port``; gRPC asks :meth:`_fetch` at each new handshake."""
        # gRPC documents that the fetcher returns None when the configuration is unchanged; the grpc stubs
        # type its result as never None.
        return grpc.dynamic_ssl_server_credentials(
            self._initial, self._fetch, require_client_authentication=True)  # type: ignore[arg-type]

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        with self._lock:
            pending, self._pending = self._pending, None
        return pending

    def reload(self) -> None:
        """Re-read the files; the next handshake uses them.

        :raises ConfigError: a file is unreadable (the previous certificates stay in use).
        """
        config = self._configuration()
        with self._lock:
            self._pending = config


class ClientTls:
    """Channel credentials presenting our certificate and verifying the server against the CA.

    :param files: client certificate, key and the CA that the server's certificate must chain to.
    """

    def __init__(self, files: TlsFiles) -> None:
        self.files = files
        self._creds = self._build()

    def _build(self) -> grpc.ChannelCredentials:
        cert, key, ca = self.files.read()
        return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)

    def credentials(self) -> grpc.ChannelCredentials:
        return self._creds

    def reload(self) -> None:
        """Re-read the files; channels opened from now on use them.

        :raises ConfigError: a file is unreadable (the previous credentials stay in use).
        """
        self._creds = self._build()
