"""The example Prometheus alert rules (systemd/prometheus-alerts.yml), checked by the real promtool: the file is
valid (``promtool check rules``), and each alert fires on the series it is meant for and not on the others
(``promtool test rules`` with tests/unit/alert_rules_test.yml). promtool comes with the Debian package
``prometheus`` (``make system-test-deps``)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "systemd" / "prometheus-alerts.yml"
RULE_TESTS = Path(__file__).resolve().parent / "alert_rules_test.yml"
# The series the rules read: the agent's, under dcgm-exporter's names, and the coordinator's.
SIGNALS = ("DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_ROW_REMAP_FAILURE",
           "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", 'gptrm_gpu_health{state="unhealthy"}')


@pytest.fixture(scope="module")
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool not found: install the test packages with `make system-test-deps` (Debian: prometheus)")
    return found


def _run(promtool: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool, *args], capture_output=True, text=True, timeout=120, cwd=ROOT, check=False)


def test_rules_are_valid(promtool: str) -> None:
    done = _run(promtool, "check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_alerts_fire_on_their_series(promtool: str) -> None:
    done = _run(promtool, "test", "rules", str(RULE_TESTS))
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_signal_has_an_alert() -> None:
    text = RULES.read_text()
    assert [s for s in SIGNALS if s not in text] == []
