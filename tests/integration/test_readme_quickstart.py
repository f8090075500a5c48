"""The README's quick start, run line by line against ``make run``'s dev cluster, so that the two never drift.

The commands are read from the README itself: the first fenced block under the "Quick start" heading must be
``make run`` (started here as ``python -m coordinator.devcluster``, what that target runs), the second is run
by ``bash`` in the same directory with ``.venv/bin`` standing for the checkout's venv, one command at a time:
a command that exits non-zero fails the test, naming the line and its output.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from coordinator.leftover_tasks import kill_leftover_tasks
from tests.integration.test_devcluster import DevCluster

README = Path(__file__).resolve().parents[2] / "README.md"
HEADING = "## Quick start"


def quickstart_blocks(text: str) -> list[list[str]]:
    """The fenced blocks of the README's quick-start section, each as its commands: comments dropped,
    lines ending in a backslash joined with the next."""
    section = text.split(f"\n{HEADING}\n", 1)[1].split("\n## ", 1)[0]
    blocks = []
    for body in re.findall(r"^```sh\n(.*?)^```", section, flags=re.M | re.S):
        commands: list[str] = []
        pending = ""
        for raw in body.splitlines():
            line = pending + raw
            if line.endswith("\\"):
                pending = line[:-1]
                continue
            pending = ""
            if line.strip() and not line.lstrip().startswith("#"):
                commands.append(line.strip())
        blocks.append(commands)
    return blocks


def _script(commands: list[str]) -> str:
    """``commands`` as one bash script that stops at the first failing one and names it."""
    out = ["set -o pipefail"]
    for i, command in enumerate(commands):
        failed = f"echo \"quick start command {i + 1} failed ($?): \"{shlex.quote(command)} >&2; exit 1"
        out.append(command if command.endswith("&") else f"{command} || {{ {failed}; }}")
    return "\n".join(out) + "\n"


def test_the_readme_has_a_runnable_quick_start() -> None:
    """The quick start is where the test looks for it: ``make run``, then the commands to try."""
    blocks = quickstart_blocks(README.read_text())
    assert len(blocks) >= 2 and blocks[0] == ["make run"], blocks
    assert any(c.startswith("gptrmctl submit") or "gptrmctl submit" in c for c in blocks[1])


@pytest.mark.slow
def test_quick_start_runs_line_by_line(tmp_path: Path) -> None:
    """Every command of the README's quick start succeeds against a fresh dev cluster."""
    blocks = quickstart_blocks(README.read_text())
    assert blocks[0] == ["make run"], blocks[0]
    (tmp_path / ".venv").symlink_to(Path(sys.executable).parent.parent)
    dc = DevCluster(tmp_path)
    shell = None
    try:
        dc.printed_commands()   # the node registered
        env = {**os.environ, "GPTRM_COORDINATOR": dc.listen, "PYTHONUNBUFFERED": "1"}
        env.pop("GPTRM_INSECURE", None)
        shell = subprocess.Popen(["bash", "-c", _script(blocks[1])], cwd=tmp_path, env=env, text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 start_new_session=True)
        out, _ = shell.communicate(timeout=120)
        assert shell.returncode == 0, out + "\n--- dev cluster ---\n" + "\n".join(dc.lines[-40:])
    finally:
        if shell is not None:   # what the quick start left in the background (its second agent)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(shell.pid, signal.SIGTERM)
        dc.stop()
        for agent_dir in (tmp_path / ".gptrm").glob("agent*"):
            kill_leftover_tasks(str(agent_dir) + os.sep)


def test_make_run_passes_args_to_the_dev_cluster() -> None:
    """``make run ARGS="..."`` hands ARGS to the dev cluster, which appends them to the coordinator's flags."""
    printer = f"{sys.executable} -c 'import os, sys; print(os.environ[sys.argv[1]])' GPTRM_DEV_COORDINATOR_ARGS"
    args = "ARGS=--price-kwh 0.2 --price-gpu-hour 'H100=2.5'"
    res = subprocess.run(["make", "-s", "-C", str(README.parent), "run", args, f"PY={printer}", "STAMP="],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[0] == "--price-kwh 0.2 --price-gpu-hour 'H100=2.5'"


@pytest.mark.slow
def test_dev_cluster_coordinator_flags_win(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Flags passed through (GPTRM_DEV_COORDINATOR_ARGS) reach the coordinator: the usage report's prices."""
    monkeypatch.setenv("GPTRM_DEV_COORDINATOR_ARGS", "--price-kwh 0.2 --price-gpu-hour 'H100=2.5'")
    dc = DevCluster(tmp_path)
    try:
        dc.printed_commands()   # the node registered
        ctl = [str(Path(sys.executable).parent / "gptrmctl"), "--insecure", "--coordinator", dc.listen]
        res = subprocess.run([*ctl, "-o", "json", "usage"], capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        assert json.loads(res.stdout)["prices"] == {"gpu_hour": {"H100": 2.5}, "kwh": 0.2}
    finally:
        dc.stop()
