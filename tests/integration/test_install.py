"""make install/uninstall with DESTDIR, the hardened units, and sd_notify from both daemons."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers.sim import synthetic_trace
from tests.integration.harness import BIN, Cluster, Proc

ROOT = Path(__file__).resolve().parents[2]


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if "venv/" not in str(p.relative_to(root))}


class TestInstall:
    @pytest.mark.slow
    def test_install_then_uninstall_keeps_only_configs(self, tmp_path: Path) -> None:
        """make install DESTDIR=... lays out venv, units, sysusers and configs; a second install keeps an edited
        config; make uninstall leaves nothing but /etc/gptrm."""
        dest = tmp_path / "root"
        make = ["make", "-s", "-C", str(ROOT), f"DESTDIR={dest}", "PIP_ARGS=--no-deps",
                f"PYTHON={shutil.which('python3')}"]
        subprocess.run([*make, "install"], check=True, capture_output=True, timeout=300)
        assert {"etc/gptrm/agent.toml", "etc/gptrm/coordinator.toml", "etc/gptrm/pki",
                "etc/systemd/system/gptrm-agent.service", "etc/systemd/system/gptrm-coordinator.service",
                "usr/lib/sysusers.d/gptrm.conf", "opt/gptrm/README.md", "opt/gptrm/venv"} <= _tree(dest)
        for exe in ("gptrm-agent", "gptrm-coordinator", "gptrmctl"):
            assert os.access(dest / "opt/gptrm/venv/bin" / exe, os.X_OK)
        (dest / "etc/gptrm/agent.toml").write_text("# edited by the operator\n")
        subprocess.run([*make, "install"], check=True, capture_output=True, timeout=300)
        assert (dest / "etc/gptrm/agent.toml").read_text() == "# edited by the operator\n"
        subprocess.run([*make, "uninstall"], check=True, capture_output=True, timeout=120)
        assert _tree(dest) == {"etc", "etc/gptrm", "etc/gptrm/agent.toml", "etc/gptrm/coordinator.toml",
                               "etc/gptrm/pki", "etc/systemd", "etc/systemd/system", "usr", "usr/lib",
                               "usr/lib/sysusers.d", "opt"}


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
class TestUnits:
    @pytest.mark.parametrize(("unit", "goal"), [("gptrm-coordinator.service", 2.5), ("gptrm-agent.service", 5.0)])
    def test_verify_and_security_score(self, unit: str, goal: float, tmp_path: Path) -> None:
        """systemd-analyze verify passes (binary path pointed at this venv) and the offline exposure is within goal."""
        text = (ROOT / "systemd" / unit).read_text().replace("/opt/gptrm/venv/bin", str(BIN))
        path = tmp_path / unit
        path.write_text(text)
        res = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        res = subprocess.run(["systemd-analyze", "security", "--offline=true", str(path)], capture_output=True,
                             text=True, timeout=60)
        score = float(re.search(r"Overall exposure level for \S+: ([\d.]+)", res.stdout).group(1))
        assert score <= goal, res.stdout[-2000:]
        assert "example.invalid" not in text and "Documentation=file:///opt/gptrm/README.md" in text


def _notify_socket(tmp_path: Path) -> tuple[socket.socket, str]:
    path = str(tmp_path / "notify.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)
    s.settimeout(0.5)
    return s, path


def _collect(s: socket.socket, seconds: float) -> list[str]:
    end, out = time.monotonic() + seconds, []
    while time.monotonic() < end:
        with contextlib.suppress(TimeoutError):
            out.append(s.recv(4096).decode())
    return out


class TestNotify:
    @pytest.mark.parametrize("daemon", ["coordinator", "agent"])
    def test_ready_and_watchdog_stop_when_stuck(self, daemon: str, cluster: Cluster, tmp_path: Path) -> None:
        """The daemon sends READY=1 then WATCHDOG=1 repeatedly, and none while its process is stopped (stuck)."""
        sock, path = _notify_socket(tmp_path)
        env = {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "400000"}
        if daemon == "coordinator":
            cluster.start_coordinator("c1")
            proc = cluster.proc("c1")
            proc.stop()
            proc = Proc(proc.argv, tmp_path / "c1-notify.log", env=env).start()
        else:
            cluster.start_coordinator("c1")
            proc = Proc(cluster.start_agent("n1").argv, tmp_path / "n1-notify.log", env=env)
            cluster.agents["n1"].stop()
            proc.start()
        try:
            got = _collect(sock, 6.0)
            assert "READY=1" in got and got.count("WATCHDOG=1") >= 3, (got, proc.tail())
            assert got.index("READY=1") < got.index("WATCHDOG=1")
            proc.signal(signal.SIGSTOP)
            _collect(sock, 0.3)   # drain what was in flight
            assert "WATCHDOG=1" not in _collect(sock, 1.5)
            proc.signal(signal.SIGCONT)
            assert "WATCHDOG=1" in _collect(sock, 2.0)
        finally:
            proc.stop()
            sock.close()


class TestPlainPipInstall:
    @pytest.mark.slow
    def test_simulate_after_a_plain_pip_install(self, tmp_path: Path) -> None:
        """`pip install .` into a fresh venv is the agent alone: the agent imports, gptrmctl and gptrm-coordinator
        name the extra they need. Then `pip install .[ctl]` and gptrmctl simulate on a small generated trace:
        exit 0, results written, one notice that plots need the sim extra."""
        venv = tmp_path / "venv"
        subprocess.run([shutil.which("python3") or "python3", "-m", "venv", str(venv)], check=True, timeout=120)
        py = venv / "bin" / "python"
        subprocess.run([str(py), "-m", "pip", "install", "--quiet", str(ROOT)], check=True, capture_output=True,
                       timeout=600, cwd=tmp_path)
        res = subprocess.run([str(py), "-c", "import sys, agent.daemon; print(' '.join(sorted(sys.modules)))"],
                             capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert res.returncode == 0, res.stderr
        assert not {"numpy", "rich", "cryptography", "etcd3", "yaml"} & set(res.stdout.split())
        for exe, extra in (("gptrmctl", "ctl"), ("gptrm-coordinator", "coordinator")):
            res = subprocess.run([str(venv / "bin" / exe), "--help"], capture_output=True, text=True, timeout=60,
                                 cwd=tmp_path)
            assert res.returncode == 1 and f"pip install 'gptrm[{extra}]'" in res.stderr, res.stderr
        subprocess.run([str(py), "-m", "pip", "install", "--quiet", f"{ROOT}[ctl]"], check=True,
                       capture_output=True, timeout=600, cwd=tmp_path)
        assert subprocess.run([str(py), "-c", "import matplotlib"], capture_output=True, cwd=tmp_path).returncode != 0
        (tmp_path / "trace").mkdir()
        jobs, nodes = synthetic_trace(tmp_path / "trace", n_jobs=60, n_nodes=8)
        out = tmp_path / "out"
        res = subprocess.run([str(venv / "bin" / "gptrmctl"), "simulate", "--jobs", str(jobs), "--nodes",
                              str(nodes), "--policies", "max-utilization", "--out", str(out)],
                             capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert res.returncode == 0, res.stderr
        assert [line for line in res.stderr.splitlines() if "matplotlib" in line] == \
            ["gptrmctl simulate: plots skipped: matplotlib is not installed (pip install 'gptrm[sim]')"]
        assert (out / "results.json").exists() and (out / "results.md").exists()
        # the measured scaling curves that --elastic replays ship as package data, found outside the checkout
        curves = subprocess.run([str(py), "-c", "from coordinator.simulator.scaling import default_scaling_dir as d, "
                                 "load_curves; print(d(), len(load_curves(d())))"],
                                capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert curves.returncode == 0, curves.stderr
        where, count = curves.stdout.split()
        assert count == "6" and str(venv) in where, curves.stdout
