"""docs/pytorch.md's gptrmctl submit commands are ones gptrmctl takes and the coordinator accepts."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from coordinator.ctl.main import build_parser
from coordinator.ctl.spec import spec_from_args
from coordinator.profiler.validation import validate_spec

DOC = Path(__file__).resolve().parents[4] / "docs" / "pytorch.md"


def _submits() -> list[list[str]]:
    """Each ``gptrmctl submit`` command of the doc's shell blocks, continuation lines joined, comments dropped."""
    out = []
    for block in re.findall(r"```sh\n(.*?)```", DOC.read_text(), re.S):
        for command in block.replace("\\\n", " ").splitlines():
            words = shlex.split(command, comments=True)
            if words[:2] == ["gptrmctl", "submit"]:
                out.append(words[1:])
    return out


def test_every_submit_in_the_doc_parses_and_validates() -> None:
    submits = _submits()
    assert len(submits) == 3, submits   # the 2-node job and the two elastic ones
    for argv in submits:
        spec = spec_from_args(build_parser().parse_args(argv))
        validate_spec(spec, max_gpus_per_node=8)
        assert spec.launcher == "torchrun", argv
