"""gptrm-coordinator and gptrmctl name the extra to install when its packages are missing."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

import pytest

from coordinator import scripts


def test_nothing_missing_in_the_test_venv() -> None:
    assert scripts.missing_extra("gptrm-coordinator", "coordinator", scripts.COORDINATOR_MODULES) is None
    assert scripts.missing_extra("gptrmctl", "ctl", scripts.CTL_MODULES) is None


@pytest.mark.parametrize(("entry", "prog", "extra", "absent"), [
    (scripts.coordinator_main, "gptrm-coordinator", "coordinator", "etcd3"),
    (scripts.ctl_main, "gptrmctl", "ctl", "rich"),
])
def test_missing_extra_is_one_line_naming_it(
        entry: Callable[[list[str]], int], prog: str, extra: str, absent: str,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The entry point returns 1 with one line on stderr, before importing the command's module."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == absent else real(name, *a))
    assert entry(["--help"]) == 1
    err = capsys.readouterr().err
    assert err == (f"{prog}: the '{extra}' extra is not installed (missing: {absent}); "
                   f"install it with: pip install 'gptrm[{extra}]'\n")


def test_the_coordinator_collects_young_objects_less_often(capsys: pytest.CaptureFixture[str]) -> None:
    """gptrm-coordinator raises the collector's first threshold before it loads its config (a bad flag still
    ends it, after that)."""
    import gc

    from coordinator import server

    before = gc.get_threshold()
    try:
        with pytest.raises(SystemExit):
            server.main(["--no-such-flag"])
        assert gc.get_threshold()[0] == server.YOUNG_COLLECTION > before[0]
    finally:
        gc.set_threshold(*before)
    capsys.readouterr()
