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
