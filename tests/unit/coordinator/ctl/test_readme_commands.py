"""The README's list of gptrmctl commands names every command the CLI has, so that the two do not drift."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from coordinator.ctl.main import build_parser

README = Path(__file__).resolve().parents[4] / "README.md"


def _commands() -> set[str]:
    parser = build_parser()
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return set(sub.choices)


def test_every_command_is_in_the_readme_list() -> None:
    section = README.read_text().split("\n### The commands\n", 1)[1]
    block = section.split("```", 2)[1]
    listed = set()
    for line in block.splitlines():
        m = re.match(r"^  ([a-z|-]+)", line)
        if m:
            listed.update(m.group(1).split("|"))
    assert _commands() <= listed, f"missing from the README's command list: {sorted(_commands() - listed)}"
