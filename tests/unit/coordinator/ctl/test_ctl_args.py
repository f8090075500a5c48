"""gptrmctl argument checks that refuse bad input before any request is sent."""

from __future__ import annotations

import argparse

import pytest

from coordinator.ctl.argtypes import gpu_ref
from coordinator.ctl.completion import completion_script
from coordinator.ctl.main import build_parser, main
from coordinator.ctl.transport import EXIT_USAGE


class TestPolicyThreshold:
    @pytest.mark.parametrize("value", ["0", "-0.5", "nan", "inf"])
    def test_bad_threshold_refused(self, value: str, capsys: pytest.CaptureFixture[str]) -> None:
        """A threshold of 0 (which the wire would read as "keep"), negative, NaN or infinite exits with the usage
        code naming --threshold; the coordinator refuses other out-of-range values."""
        rc = main(["--coordinator", "127.0.0.1:1", "policy", "set", "load-balancing", "--threshold", value])
        assert rc == EXIT_USAGE
        assert "--threshold" in capsys.readouterr().err


class TestNodesRm:
    def test_rm_without_node_refused(self, capsys: pytest.CaptureFixture[str]) -> None:
        """`nodes rm` without a node exits with the usage code before any request is sent."""
        rc = main(["--coordinator", "127.0.0.1:1", "nodes", "rm"])
        assert rc == EXIT_USAGE
        assert "nodes rm" in capsys.readouterr().err


def _parse(*argv: str) -> dict[str, object]:
    """The parsed namespace without the command's function (the same closure is not built twice)."""
    return {k: v for k, v in vars(build_parser().parse_args(list(argv))).items() if k != "fn"}


class TestGlobalOptionsAfterCommand:
    def test_output_after_the_command(self) -> None:
        """`tasks -o wide` reads as `-o wide tasks`, and --output the same."""
        assert _parse("tasks", "-o", "wide") == _parse("-o", "wide", "tasks")
        assert _parse("tasks", "--output", "wide")["output"] == "wide"

    def test_every_global_option_after_the_command(self) -> None:
        """Connection, TLS and credential options after the command parse as before it."""
        opts = ["--insecure", "--coordinator", "127.0.0.1:1", "--tls-cert", "c.pem", "--tls-key", "k.pem",
                "--tls-ca", "ca.pem", "--token", "t0k", "--timeout", "3", "--debug", "-o", "json"]
        before = _parse(*opts, "nodes", "n1")
        assert _parse("nodes", *opts, "n1") == before
        assert _parse("nodes", "n1", *opts) == before
        assert before["insecure"] is True and before["coordinator"] == "127.0.0.1:1" and before["timeout"] == 3.0

    def test_after_a_sub_command(self) -> None:
        """Sub-commands take them too: policy set, certs ca create, and between a command and its sub-command."""
        args = _parse("policy", "set", "binpack", "--threshold", "0.5", "-o", "json", "--coordinator", "h:1")
        assert (args["output"], args["coordinator"], args["name"]) == ("json", "h:1", "binpack")
        assert _parse("policy", "-o", "json", "get")["output"] == "json"
        assert _parse("certs", "ca", "create", "--debug")["debug"] is True
        assert _parse("queues", "set", "team", "--gpus", "2", "-o", "wide")["output"] == "wide"

    def test_after_the_command_wins(self) -> None:
        """Given in both places, the value after the command is the one used; one not repeated keeps its value."""
        args = _parse("-o", "json", "--coordinator", "a:1", "--timeout", "5", "tasks", "-o", "wide",
                      "--coordinator", "b:2")
        assert (args["output"], args["coordinator"], args["timeout"]) == ("wide", "b:2", 5.0)

    def test_defaults_unchanged_when_not_given(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """A command without global options still gets the top-level defaults, environment included."""
        monkeypatch.setenv("GPTRM_COORDINATOR", "env:9")
        monkeypatch.setenv("GPTRM_INSECURE", "1")
        args = _parse("status")
        assert (args["coordinator"], args["insecure"], args["output"], args["timeout"]) == ("env:9", True, "table",
                                                                                              10.0)

    def test_help_says_which_wins(self, capsys: pytest.CaptureFixture[str]) -> None:
        """Both the top-level help and a command's help say that the option after the command wins."""
        for argv in (["--help"], ["tasks", "--help"]):
            assert main(argv) == 0
            assert "the one after the command wins" in " ".join(capsys.readouterr().out.split())

    def test_unknown_flag_still_a_usage_error(self, capsys: pytest.CaptureFixture[str]) -> None:
        """An unknown flag after the command exits 2 with one line naming it."""
        rc = main(["tasks", "-o", "wide", "--no-such-flag"])
        err = capsys.readouterr().err
        assert rc == EXIT_USAGE
        assert [ln for ln in err.splitlines() if ln.startswith("gptrmctl:")] == [
            "gptrmctl: unrecognized arguments: --no-such-flag"]

    def test_bad_value_after_the_command(self, capsys: pytest.CaptureFixture[str]) -> None:
        """A format that does not exist, after the command, is a usage error naming the command and -o."""
        assert main(["tasks", "-o", "yaml"]) == EXIT_USAGE
        assert "tasks: argument -o/--output: invalid choice: 'yaml'" in capsys.readouterr().err

    def test_csv_still_only_for_usage(self, capsys: pytest.CaptureFixture[str]) -> None:
        """-o csv after the command is refused for anything but usage, as before the command."""
        assert main(["--coordinator", "127.0.0.1:1", "tasks", "-o", "csv"]) == EXIT_USAGE
        assert "only usage writes CSV, not tasks" in capsys.readouterr().err
        assert _parse("usage", "-o", "csv")["output"] == "csv"


class TestCompletionLists:
    def test_commands_list_their_own_flags_and_globals_on_dash(self) -> None:
        """A command's completions are its own flags (the global ones are offered for a word starting with -)."""
        script = completion_script(build_parser(), "bash")
        assert "    cordon) opts='-h --help'; ids=nodes ;;" in script
        assert "    tasks) opts='-h --help --user -u --queue -q --name --state --page-size'; ids=tasks ;;" in script
        assert ('opts="$opts --coordinator -o --output --tls-cert --tls-key --tls-ca --insecure --token --timeout '
                '--debug"') in script


def test_gpu_ref_parses_node_and_indices() -> None:
    """``gpus resume`` takes NODE (all its fenced GPUs) or NODE:INDEX[,INDEX]; a bad index is a usage error."""
    assert gpu_ref("n1") == ("n1", [])
    assert gpu_ref("n1:3") == ("n1", [3])
    assert gpu_ref("n1:3,5") == ("n1", [3, 5])
    for bad in ("n1:", "n1:x", "n1:-1", ":3"):
        with pytest.raises(argparse.ArgumentTypeError):
            gpu_ref(bad)
