"""Configuration merging and validation (common.config)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from common.config import load_config, option, positive
from common.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Sample:
    listen: str = option("127.0.0.1:1", "address")
    interval_s: float = option(1.0, "interval", flag="interval", check=positive)
    retries: int = option(3, "retries")
    verbose: bool = option(False, "verbose")
    paths: list[str] = option(["/"], "paths")
    labels: dict[str, str] = option({}, "labels")
    mode: str = option("a", "mode", choices=("a", "b"))
    state_dir: str = option("", "a directory", path=True)
    data: list[str] = option([], "directories", path=True)


def _load(argv: list[str], env: dict[str, str] | None = None) -> Sample:
    return load_config(Sample, argv, prog="test", env=env or {})


class TestLoadConfig:
    def test_defaults(self) -> None:
        """With no sources every field keeps its default."""
        assert _load([]) == Sample()

    def test_precedence_file_env_flag(self, tmp_path: Path) -> None:
        """Flags win over the environment, which wins over the TOML file."""
        f = tmp_path / "c.toml"
        f.write_text('interval = 5.0\nretries = 7\nlisten = "h:1"\n')
        cfg = _load(["--config", str(f), "--interval", "2"], {"GPTRM_INTERVAL": "3", "GPTRM_RETRIES": "9"})
        assert (cfg.interval_s, cfg.retries, cfg.listen) == (2.0, 9, "h:1")

    def test_lists_and_tables(self, tmp_path: Path) -> None:
        """Comma lists and KEY=VALUE pairs parse from text; TOML arrays and tables directly."""
        cfg = _load(["--paths", "/a,/b", "--labels", "rack=r1,zone=z"])
        assert cfg.paths == ["/a", "/b"] and cfg.labels == {"rack": "r1", "zone": "z"}
        f = tmp_path / "c.toml"
        f.write_text('paths = ["/x"]\nlabels = { k = "v" }\nverbose = true\n')
        cfg = _load(["--config", str(f)])
        assert cfg.paths == ["/x"] and cfg.labels == {"k": "v"} and cfg.verbose is True

    @pytest.mark.parametrize(
        ("toml", "argv", "env", "needle"),
        [
            ("bogus = 1\n", [], {}, "unknown key 'bogus'"),
            ('retries = "three"\n', [], {}, "retries: expected an integer"),
            ("interval = true\n", [], {}, "interval: expected a number"),
            ("", ["--interval", "-1"], {}, "interval: must be a positive number, got '-1' (from flag --interval)"),
            ("", [], {"GPTRM_RETRIES": "x"}, "(from env GPTRM_RETRIES)"),
            ("", ["--mode", "c"], {}, "mode: must be one of a, b"),
            ("", ["--labels", "novalue"], {}, "expected KEY=VALUE"),
            ("interval = [\n", [], {}, "is not valid TOML"),
        ],
    )
    def test_bad_values_name_the_field(self, tmp_path: Path, toml: str, argv: list[str], env: dict[str, str],
                                       needle: str) -> None:
        """Every bad value is a ConfigError whose message names the field and source."""
        f = tmp_path / "c.toml"
        f.write_text(toml)
        with pytest.raises(ConfigError) as err:
            _load(["--config", str(f), *argv], env)
        assert needle in str(err.value)

    def test_missing_file(self, tmp_path: Path) -> None:
        """A config path that does not exist is a clear error."""
        with pytest.raises(ConfigError, match="not found"):
            _load(["--config", str(tmp_path / "nope.toml")])

    def test_relative_paths_are_made_absolute_at_load(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """A relative path from a flag, the environment or the file is made absolute against the directory the
        process started in (a task's wrapper runs elsewhere); "" and absolute paths stay as they are."""
        monkeypatch.chdir(tmp_path)
        f = tmp_path / "c.toml"
        f.write_text('data = ["a", "/abs", "../b"]\n')
        cfg = _load(["--config", str(f), "--state-dir", "state/./x"])
        assert cfg.state_dir == str(tmp_path / "state" / "x")
        assert cfg.data == [str(tmp_path / "a"), "/abs", str(tmp_path.parent / "b")]
        assert _load([], {"GPTRM_STATE_DIR": "s"}).state_dir == str(tmp_path / "s")
        assert _load([]).state_dir == ""

    def test_agent_and_coordinator_paths_are_absolute(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """Every path setting of the agent and the coordinator (state directories, certificates, data paths, the
        coordinator's token, audit and queue files) is absolute once loaded."""
        from agent import config as agent_config
        from coordinator import config as coordinator_config

        monkeypatch.chdir(tmp_path)
        agent = agent_config.load(["--state-dir", "st", "--data-paths", "d1,/d2", "--insecure"])
        assert (agent.state_dir, agent.data_paths) == (str(tmp_path / "st"), [str(tmp_path / "d1"), "/d2"])
        coordinator = coordinator_config.load(["--state-dir", "cst", "--audit-log", "audit.jsonl", "--queues",
                                               "q.toml", "--admin-tokens", "tokens", "--insecure"])
        assert coordinator.state_dir == str(tmp_path / "cst")
        assert (coordinator.audit_log, coordinator.queues_file, coordinator.admin_tokens) == (
            str(tmp_path / "audit.jsonl"), str(tmp_path / "q.toml"), str(tmp_path / "tokens"))
