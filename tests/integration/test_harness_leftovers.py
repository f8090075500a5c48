"""The harness's check that no test leaves a task process behind (tests/integration/conftest.py)."""

from __future__ import annotations

import os
import secrets
import subprocess
from pathlib import Path

import psutil
import pytest

from agent.task_user import CLAIMS_DIR
from tests.integration.harness import StartedAgent, describe, task_processes_left, wait_until

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="running a process as a task uid needs root")


def _as_uid(uid: int, marker: str) -> subprocess.Popen:
    return subprocess.Popen(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--", "sleep", marker],
                            stdin=subprocess.DEVNULL)


class TestTaskProcessesLeft:
    def test_a_process_running_as_a_task_uid_is_found_and_named(self, tmp_path: Path) -> None:
        uid = 1_952_000_000 + secrets.randbelow(1_000_000)
        agent = StartedAgent(tmp_path / "agent-n1", range(uid, uid + 1))
        marker = str(4000 + secrets.randbelow(1000))
        proc = _as_uid(uid, marker)
        try:
            # found once setpriv (which takes the uid first) has exec'd the command it names: until then its own
            # command line (which ends with the marker too) is what is seen
            named = f"pid {proc.pid} uid {uid}: sleep {marker}"
            found = wait_until(lambda: (f := task_processes_left([agent])) and describe(f[0]) == named and f,
                               10, what="the process found and named")
            assert [p.pid for p in found] == [proc.pid]
        finally:
            proc.kill()
            proc.wait()
        assert task_processes_left([agent]) == []

    def test_a_uid_another_agent_claimed_is_not_this_runs(self, tmp_path: Path) -> None:
        """Another agent on the host (another test run) holds the uid: its process is not reported."""
        uid = 1_953_000_000 + secrets.randbelow(1_000_000)
        agent = StartedAgent(tmp_path / "agent-n1", range(uid, uid + 1))
        CLAIMS_DIR.mkdir(parents=True, exist_ok=True)
        claim = CLAIMS_DIR / str(uid)
        claim.write_text("another\n")
        proc = _as_uid(uid, "4999")
        try:
            wait_until(lambda: psutil.Process(proc.pid).uids().real == uid, 10, what="the process running as the uid")
            assert task_processes_left([agent]) == []
        finally:
            proc.kill()
            proc.wait()
            claim.unlink(missing_ok=True)
