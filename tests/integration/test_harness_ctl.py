"""The harness's forked gptrmctl (tests/helpers/ctl_forks.py) answers as the installed gptrmctl run afresh does."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.ctl_forks import CtlForks
from tests.integration.harness import BIN


@pytest.fixture
def forks() -> Iterator[CtlForks]:
    f = CtlForks(BIN / "gptrmctl")
    yield f
    f.close()


def _fresh(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "gptrmctl"), *argv], capture_output=True, text=True, timeout=60)


class TestCtlForks:
    @pytest.mark.parametrize("argv", [
        ["--insecure", "--coordinator", "127.0.0.1:1", "--timeout", "1", "-o", "json", "tasks"],   # refused
        ["frobnicate"],                                                                             # usage error
        ["submit", "--gpus", "1"],                                                                  # no command
        ["completion", "bash"],                                                                     # output
    ])
    def test_same_exit_code_and_output_as_a_fresh_process(self, forks: CtlForks, argv: list[str]) -> None:
        fresh, forked = _fresh(argv), forks.run(argv, 60)
        assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
        assert forked.args == [str(BIN / "gptrmctl"), *argv]

    def test_each_command_gets_the_callers_environment_and_directory(self, forks: CtlForks, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
        """gptrmctl certs makes its CA where GPTRM_PKI_DIR says, and a relative --dir is in the caller's working
        directory, as they are at the call."""
        monkeypatch.chdir(tmp_path)
        monkeypatch.setenv("GPTRM_PKI_DIR", str(tmp_path / "from-env"))
        res = forks.run(["certs", "ca", "create"], 60)
        assert res.returncode == 0, res.stderr
        monkeypatch.delenv("GPTRM_PKI_DIR")
        res = forks.run(["certs", "--dir", "relative", "ca", "create"], 60)
        assert res.returncode == 0, res.stderr
        assert sorted(os.listdir(tmp_path)) == ["from-env", "relative"]
        assert os.listdir(tmp_path / "from-env") and os.listdir(tmp_path / "relative")

    def test_a_command_past_its_timeout_is_killed_and_the_next_one_runs(self, forks: CtlForks) -> None:
        """A coordinator that accepts the connection and never answers: the caller's timeout kills the command."""
        with socket.socket() as silent:
            silent.bind(("127.0.0.1", 0))
            silent.listen()
            addr = f"127.0.0.1:{silent.getsockname()[1]}"
            with pytest.raises(subprocess.TimeoutExpired):
                forks.run(["--insecure", "--coordinator", addr, "--timeout", "60", "status"], 2)
        assert forks.run(["frobnicate"], 60).returncode == _fresh(["frobnicate"]).returncode

    def test_a_call_interrupted_while_it_waits_leaves_the_next_one_its_own_answer(self, forks: CtlForks) -> None:
        """An exception in the caller while a command runs (as pytest-timeout's alarm raises one): the next command
        gets its own exit code and output, not the interrupted one's."""
        class Interrupted(Exception):
            pass

        def interrupt(*_: object) -> None:
            raise Interrupted

        previous = signal.signal(signal.SIGALRM, interrupt)
        try:
            with socket.socket() as silent:
                silent.bind(("127.0.0.1", 0))
                silent.listen()
                signal.setitimer(signal.ITIMER_REAL, 1.0)
                with pytest.raises(Interrupted):
                    forks.run(["--insecure", "--coordinator", f"127.0.0.1:{silent.getsockname()[1]}", "--timeout",
                               "3", "status"], 60)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        fresh, forked = _fresh(["frobnicate"]), forks.run(["frobnicate"], 60)
        assert (forked.returncode, forked.stderr) == (fresh.returncode, fresh.stderr)
