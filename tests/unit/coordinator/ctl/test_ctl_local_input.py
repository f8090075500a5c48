"""gptrmctl never crashes on its own input: bad local input is a usage error (2) naming the problem,
an internal error is 70 with one line; no request is sent (no coordinator listens here)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from coordinator.ctl import main as ctl_main_module
from coordinator.ctl.main import main
from coordinator.ctl.transport import EXIT_INTERNAL, EXIT_USAGE

BIN = Path(sys.executable).parent
NOWHERE = ["--insecure", "--coordinator", "127.0.0.1:1", "--timeout", "0.5"]


def _ctl(*args: str | bytes) -> subprocess.CompletedProcess[bytes]:
    """gptrmctl as a process, with byte arguments as a non-UTF-8 command line gives them."""
    argv = [os.fsencode(str(BIN / "gptrmctl")), *(os.fsencode(a) if isinstance(a, str) else a
                                                   for a in (*NOWHERE, *args))]
    return subprocess.run(argv, capture_output=True, timeout=60)


def _usage(res: subprocess.CompletedProcess[bytes], *words: str) -> str:
    err = res.stderr.decode("utf-8", "backslashreplace")
    assert res.returncode == EXIT_USAGE, err
    assert "Traceback" not in err and err.count("gptrmctl:") == 1
    for word in words:
        assert word in err, err
    return err


class TestNotUtf8:
    def test_argv(self) -> None:
        """A non-UTF-8 argument of the command is a usage error naming spec.argv[i]."""
        _usage(_ctl("submit", "--", "echo", b"\xff"), "spec.argv[1]", "not valid UTF-8")

    def test_name_env_and_ids(self) -> None:
        """A non-UTF-8 flag value or id is a usage error naming the flag or argument."""
        _usage(_ctl("submit", "--name", b"a\xffb", "--", "true"), "--name", "not valid UTF-8")
        _usage(_ctl("submit", "--env", b"K=\xff", "--", "true"), "--env", "not valid UTF-8")
        _usage(_ctl("cancel", b"t-\xff"), "TASK", "not valid UTF-8")

    def test_spec_file_escape(self, tmp_path: Path) -> None:
        """A lone surrogate from a JSON escape in a spec file is a usage error naming the field."""
        f = tmp_path / "s.json"
        f.write_text('{"argv": ["true"], "name": "x\\udcff"}')
        _usage(_ctl("submit", "-f", str(f)), "spec.name", "not valid UTF-8")


class TestSpecFile:
    def test_deep_nesting(self, tmp_path: Path) -> None:
        """A JSON or YAML spec nested beyond what the parser recurses through is a usage error."""
        deep_json = tmp_path / "deep.json"
        deep_json.write_text("[" * 100_000 + "]" * 100_000)
        _usage(_ctl("submit", "-f", str(deep_json)), "nested too deeply")
        deep_yaml = tmp_path / "deep.yaml"
        deep_yaml.write_text("argv: " + "[" * 5000 + "]" * 5000)
        _usage(_ctl("submit", "-f", str(deep_yaml)), "nested too deeply")

    @pytest.mark.parametrize("doc", ['{"argv": ["true"], "nodes": 1%s}' % ("0" * 5000),
                                     '{"argv": ["true"], "model": {"params_billions": 1%s}}' % ("0" * 400),
                                     '{"argv": ["true"], "env": {"K": 1%s}}' % ("0" * 4400),
                                     '{"argv": ["true"], "qos": {"deadline": 1%s}}' % ("0" * 400),
                                     '{"argv": ["true"], "demand": {"mem_bytes": "1%sGiB"}}' % ("0" * 400)])
    def test_huge_numbers(self, doc: str, tmp_path: Path) -> None:
        """Integers beyond any field's range (or beyond what Python converts) are usage errors."""
        f = tmp_path / "s.json"
        f.write_text(doc)
        _usage(_ctl("submit", "-f", str(f)))

    def test_nul_and_env_names(self, tmp_path: Path) -> None:
        """NUL bytes and invalid env names in a spec file are refused locally, naming the field."""
        f = tmp_path / "s.json"
        f.write_text('{"argv": ["sh", "-c", "a\\u0000b"]}')
        _usage(_ctl("submit", "-f", str(f)), "spec.argv[2]: contains a NUL byte")
        f.write_text('{"argv": ["true"], "env": {"A=B": "1"}}')
        _usage(_ctl("submit", "-f", str(f)), "spec.env: key 'A=B' is not a valid variable name")

    def test_env_flag_name(self) -> None:
        """--env with a key that is not a variable name is refused before sending."""
        _usage(_ctl("submit", "--env", "1X=2", "--", "true"), "spec.env: key '1X'")


class TestNumbers:
    @pytest.mark.parametrize(("args", "word"), [
        (["tasks", "--page-size", "99999999999999999999"], "--page-size"),
        (["events", "--backlog", "99999999999999999999"], "--backlog"),
        (["scale", "s-1", "99999999999999999999"], "REPLICAS"),
        (["submit", "--replicas", "1:99999999999999999999", "--target-util", "0.5", "--", "x"], "--replicas"),
        (["submit", "--nodes", "99999999999999999999", "--", "x"], "spec.nodes"),
        (["submit", "--gpu-mem-gib", "inf", "--gpus", "1", "--", "x"], "--gpu-mem-gib"),
        (["--timeout", "nan", "status"], "--timeout"),
    ])
    def test_out_of_range(self, args: list[str], word: str) -> None:
        """Numbers no request field can hold are usage errors naming the flag."""
        _usage(_ctl(*args), word)


class TestCertsDays:
    @pytest.mark.parametrize("days", ["-1", "0", "99999999999"])
    def test_validity_that_already_ended_is_refused(self, days: str, tmp_path: Path) -> None:
        """--days below 1 (an already-expired certificate) or past what X.509 dates hold is a usage error,
        and nothing is written."""
        assert main(["certs", "--dir", str(tmp_path), "ca", "create"]) == 0
        _usage(_ctl("certs", "--dir", str(tmp_path), "issue", "admin", "bob", "--days", days), "--days")
        assert not list(tmp_path.glob("admin-*"))
        assert main(["certs", "--dir", str(tmp_path), "issue", "admin", "bob", "--days", "1"]) == 0


class TestInternalError:
    def test_bug_is_its_own_exit_code_in_one_line(self, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
        """An unexpected exception inside a command exits 70 with one line on stderr, no traceback."""
        def broken(*_: object) -> None:
            raise KeyError("boom")

        monkeypatch.setattr(ctl_main_module, "cmd_status", broken)
        assert main([*NOWHERE, "status"]) == EXIT_INTERNAL
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "internal error: KeyError" in err and "Traceback" not in err


class TestLogsRank:
    def test_rank_beyond_any_task_is_out_of_range(self) -> None:
        """A rank too large for any task is refused as out of range, not as "must be 0 or more"."""
        err = _usage(_ctl("logs", "t-1", "--rank", "99999999999"), "--rank 99999999999 is out of range")
        assert "0 or more" not in err
        _usage(_ctl("logs", "t-1", "--rank", "-1"), "--rank must be 0 or more")


class TestBrokenPipe:
    def test_reader_gone_ends_quietly(self) -> None:
        """``gptrmctl ... | head``: when the reader of its output has gone, gptrmctl ends with 141 (as SIGPIPE
        would end a shell tool) and writes nothing on stderr: no internal error, no BrokenPipeError."""
        argv = [str(BIN / "gptrmctl"), *NOWHERE, "completion", "bash"]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()   # before gptrmctl writes: its first write finds no reader
        err = proc.stderr.read()
        assert proc.wait(timeout=60) == ctl_main_module.EXIT_BROKEN_PIPE == 141, err
        assert err == b""
