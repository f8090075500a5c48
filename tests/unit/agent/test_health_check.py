"""The site health-check program (agent/health_check.py), run for real: shell scripts written by each test.

The program runs with the fixed root environment, so a script learns where to write or what to wait for from
paths written into its text, never from the environment.
"""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import psutil
import pytest
import structlog

from agent import config
from agent.health_check import (
    MESSAGE_MAX_CHARS,
    OUTPUT_TAIL_BYTES,
    TIMED_OUT,
    HealthCheck,
    last_line,
    program_problem,
    run_program,
)
from common.errors import ConfigError
from common.pb.gptrm.v1 import types_pb2
from tests.integration.harness import wait_until

Log = structlog.typing.FilteringBoundLogger
S = types_pb2.HealthCheckState


def _script(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


def _check(program: str, log: Log, *, timeout_s: float = 30.0, interval_s: float = 300.0) -> HealthCheck:
    return HealthCheck(program, interval_s=interval_s, timeout_s=timeout_s, log=log)


class TestVerdict:
    def test_non_zero_exit_is_failed_with_its_last_line(self, tmp_path: Path, log: Log) -> None:
        prog = _script(tmp_path / "check", 'echo "checking GPUs"\necho "GPU 3 missing from lspci" >&2\nexit 1')
        v = _check(prog, log).run_once()
        assert (v.state, v.message, v.exit_code) == (S.HEALTH_CHECK_STATE_FAILED, "GPU 3 missing from lspci", 1)
        assert v.ran_unix_s > 0

    def test_zero_exit_is_ok(self, tmp_path: Path, log: Log) -> None:
        v = _check(_script(tmp_path / "check", "echo all good\nexit 0"), log).run_once()
        assert (v.state, v.message, v.exit_code) == (S.HEALTH_CHECK_STATE_OK, "all good", 0)

    def test_silent_failure_says_its_exit_code(self, tmp_path: Path, log: Log) -> None:
        v = _check(_script(tmp_path / "check", "exit 7"), log).run_once()
        assert (v.state, v.message) == (S.HEALTH_CHECK_STATE_FAILED, "exited with code 7")

    def test_death_by_signal_is_failed(self, tmp_path: Path, log: Log) -> None:
        v = _check(_script(tmp_path / "check", "kill -KILL $$"), log).run_once()
        assert (v.state, v.message, v.exit_code) == (S.HEALTH_CHECK_STATE_FAILED, "killed by SIGKILL", 128 + 9)

    def test_nhc_output_unchanged(self, tmp_path: Path, log: Log) -> None:
        """LBNL NHC's failure output: its last line (before trailing blank lines) is the reason, as it is."""
        reason = "ERROR:  nhc:  Health check failed:  check_fs_mount:  /scratch not mounted"
        prog = _script(tmp_path / "nhc", f'echo "Running health checks"\necho "{reason}"\necho ""\necho "  "\nexit 1')
        v = _check(prog, log).run_once()
        assert (v.state, v.message) == (S.HEALTH_CHECK_STATE_FAILED, reason)

    def test_hang_is_killed_with_its_group_at_the_timeout(self, tmp_path: Path, log: Log) -> None:
        """A run past its timeout is FAILED ("timed out after ..."), and every process of its group is killed,
        the children it started in the background included."""
        pids = tmp_path / "pids"
        prog = _script(tmp_path / "hang", f"sleep 1000 &\necho $! > {pids}\necho $$ >> {pids}\necho started\n"
                                          "sleep 1000")
        v = _check(prog, log, timeout_s=2).run_once()   # long enough for the script to write its pids first
        assert (v.state, v.message, v.exit_code) == (S.HEALTH_CHECK_STATE_FAILED, "timed out after 2 s", TIMED_OUT)

        def gone(pid: int) -> bool:
            try:
                return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                return True

        started = [int(p) for p in pids.read_text().split()]
        assert len(started) == 2
        wait_until(lambda: all(gone(p) for p in started), timeout_s=10, what="the run's processes to be killed")

    def test_child_left_behind_does_not_hold_the_verdict(self, tmp_path: Path, log: Log) -> None:
        """A program that exits leaving a child with its output open gets its verdict at its exit, not at the
        timeout."""
        pid = tmp_path / "pid"
        prog = _script(tmp_path / "check", f"sleep 1000 &\necho $! > {pid}\necho checked\nexit 0")
        try:
            v = _check(prog, log, timeout_s=300).run_once()
            assert (v.state, v.message) == (S.HEALTH_CHECK_STATE_OK, "checked")
        finally:
            if pid.exists():
                psutil.Process(int(pid.read_text())).kill()

    def test_root_environment_only(self, tmp_path: Path, log: Log, monkeypatch: pytest.MonkeyPatch) -> None:
        """The program never sees the agent's environment: only the fixed root PATH and LANG, and runs in /."""
        monkeypatch.setenv("LD_PRELOAD", "/tmp/evil.so")
        monkeypatch.setenv("GPTRM_SECRET", "s3cret")
        prog = _script(tmp_path / "env", 'echo "$PATH|$LANG|$LD_PRELOAD|$GPTRM_SECRET|$(pwd)"')
        v = _check(prog, log).run_once()
        assert v.message == "/usr/sbin:/usr/bin:/sbin:/bin|C.UTF-8|||/"

    def test_output_is_bounded(self, tmp_path: Path) -> None:
        """Megabytes of output keep only the tail in memory; the last line is still the message."""
        prog = _script(tmp_path / "chatty", "head -c 8000000 /dev/zero | tr '\\0' 'x'\necho\necho the end\nexit 2")
        result = run_program(prog, 30.0)
        assert result.exit_code == 2
        assert len(result.output_tail) <= OUTPUT_TAIL_BYTES
        assert last_line(result.output_tail) == "the end"

    def test_message_is_bounded(self, tmp_path: Path, log: Log) -> None:
        v = _check(_script(tmp_path / "long", f"echo {'y' * 1000}\nexit 1"), log).run_once()
        assert len(v.message) == MESSAGE_MAX_CHARS and v.message.endswith("…")

    def test_program_gone_later_is_failed(self, tmp_path: Path, log: Log) -> None:
        check = _check(_script(tmp_path / "check", "exit 0"), log)
        assert check.run_once().state == S.HEALTH_CHECK_STATE_OK
        (tmp_path / "check").unlink()
        v = check.run_once()
        assert v.state == S.HEALTH_CHECK_STATE_FAILED and "does not exist" in v.message

    def test_program_made_writable_later_is_failed_unrun(self, tmp_path: Path, log: Log) -> None:
        ran = tmp_path / "ran"
        prog = _script(tmp_path / "check", f"touch {ran}")
        (tmp_path / "check").chmod(0o777)
        v = _check(prog, log).run_once()
        assert v.state == S.HEALTH_CHECK_STATE_FAILED and "writable by group or others" in v.message
        assert not ran.exists()


class TestSchedule:
    def test_pending_before_the_first_verdict(self, tmp_path: Path, log: Log) -> None:
        """Samples say PENDING until the first run ends, then carry its verdict."""
        go = tmp_path / "go"
        prog = _script(tmp_path / "check", f"while [ ! -e {go} ]; do sleep 0.05; done\necho fine")
        check = _check(prog, log)
        check.start()
        try:
            sample = types_pb2.TelemetrySample()
            check.fill(sample)
            assert sample.HasField("health_check")
            assert sample.health_check.state == S.HEALTH_CHECK_STATE_PENDING
            go.touch()
            wait_until(lambda: check.verdict.state == S.HEALTH_CHECK_STATE_OK, timeout_s=20, what="the first verdict")
            check.fill(sample)
            assert (sample.health_check.state, sample.health_check.message) == (S.HEALTH_CHECK_STATE_OK, "fine")
        finally:
            check.stop()

    def test_runs_again_every_interval(self, tmp_path: Path, log: Log) -> None:
        """The verdict follows the program from run to run: FAILED, then OK once the site's problem is fixed."""
        broken = tmp_path / "broken"
        broken.touch()
        prog = _script(tmp_path / "check", f"if [ -e {broken} ]; then echo 'ERROR: disk full'; exit 1; fi")
        check = _check(prog, log, interval_s=0.1)
        check.start()
        try:
            wait_until(lambda: check.verdict.state == S.HEALTH_CHECK_STATE_FAILED, timeout_s=20, what="FAILED")
            assert check.verdict.message == "ERROR: disk full"
            broken.unlink()
            wait_until(lambda: check.verdict.state == S.HEALTH_CHECK_STATE_OK, timeout_s=20, what="OK again")
        finally:
            check.stop()

    def test_never_two_runs_at_once(self, tmp_path: Path, log: Log) -> None:
        """Runs asked for at the same time (the schedule and others) wait for each other: the program never
        finds another run of itself in progress."""
        lock, runs = tmp_path / "lock", tmp_path / "runs"
        prog = _script(tmp_path / "check", f"mkdir {lock} || {{ echo overlap; exit 3; }}\necho run >> {runs}\n"
                                           f"sleep 0.2\nrmdir {lock}")
        check = _check(prog, log, interval_s=0.05)
        check.start()
        verdicts: list[types_pb2.NodeHealthCheck] = []
        threads = [threading.Thread(target=lambda: verdicts.append(check.run_once())) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        check.stop()
        assert [v.state for v in verdicts] == [S.HEALTH_CHECK_STATE_OK] * 3
        assert len(runs.read_text().split()) >= 4   # the three asked for, and the schedule's
        assert check.verdict.state == S.HEALTH_CHECK_STATE_OK

    def test_stop_kills_a_run_and_keeps_the_verdict(self, tmp_path: Path, log: Log) -> None:
        pid = tmp_path / "pid"
        check = _check(_script(tmp_path / "check", f"echo $$ > {pid}\nsleep 1000"), log)
        check.start()
        wait_until(lambda: pid.exists() and pid.read_text().strip(), timeout_s=20, what="the run to start")
        check.stop()
        assert check.verdict.state == S.HEALTH_CHECK_STATE_PENDING
        assert not psutil.pid_exists(int(pid.read_text())) or \
            psutil.Process(int(pid.read_text())).status() == psutil.STATUS_ZOMBIE


class TestProgramPath:
    def test_accepts_a_root_owned_executable(self, tmp_path: Path) -> None:
        assert program_problem(_script(tmp_path / "ok", "exit 0")) is None
        assert program_problem("") is None

    @pytest.mark.parametrize(("setup", "problem"), [
        ("relative", "must be an absolute path"),
        ("missing", "does not exist"),
        ("directory", "is not a regular file"),
        ("not-executable", "is not executable"),
        ("group-writable", "must not be writable by group or others"),
        ("other-owner", "must be owned by root"),
        ("open-directory", "must not be writable by group or others"),
    ])
    def test_refuses(self, tmp_path: Path, setup: str, problem: str) -> None:
        prog = _script(tmp_path / "check", "exit 0")
        path = {"relative": "check", "missing": str(tmp_path / "nope"), "directory": str(tmp_path)}.get(setup, prog)
        if setup == "not-executable":
            os.chmod(prog, 0o644)
        elif setup == "group-writable":
            os.chmod(prog, 0o775)
        elif setup == "other-owner":
            os.chown(prog, 4242, 4242)
        elif setup == "open-directory":
            tmp_path.chmod(0o777)
        found = program_problem(path)
        assert found is not None and problem in found

    def test_sticky_directory_is_fine(self, tmp_path: Path) -> None:
        tmp_path.chmod(0o777 | stat.S_ISVTX)
        assert program_problem(_script(tmp_path / "check", "exit 0")) is None

    def test_agent_flag_names_the_setting(self, tmp_path: Path) -> None:
        with pytest.raises(ConfigError, match=r"health_check_program: must be an absolute.*--health-check-program"):
            config.load(["--insecure", "--health-check-program", "nhc"])
        prog = _script(tmp_path / "nhc", "exit 0")
        cfg = config.load(["--insecure", "--health-check-program", prog, "--health-check-interval", "60"])
        assert (cfg.health_check_program, cfg.health_check_interval_s, cfg.health_check_timeout_s) == (prog, 60.0, 60.0)
        default = config.load(["--insecure"])
        assert (default.health_check_program, default.health_check_interval_s) == ("", 300.0)
