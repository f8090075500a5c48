"""The repository stands alone: nothing it ships or documents points at files beside the checkout.

A fresh clone has only the repository, so no code, test or document may read or send a reader to
paths outside it (a sibling ``shared/`` directory, design briefs), and the data that tests and the
README need ships inside it.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from coordinator.simulator.scaling import MODELS, default_scaling_dir, load_curves

ROOT = Path(__file__).resolve().parents[3]
# Spelled in pieces, so that this file does not itself hold the references it looks for.
_OUTSIDE = re.compile("|".join([r"\.\./" + "shared", "shared/" + "(traces|scaling)", "DESIGN" + r"\.md",
                                "STYLE" + r"\.md", r"\bthe " + r"brief\b", r"\bthe " + r"issue'?s?\b"]),
                      re.IGNORECASE)
_SELF = Path(__file__).resolve().relative_to(ROOT).as_posix()


def _tracked_text_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    paths = [ROOT / p for p in out.decode().split("\0") if p]
    return [p for p in paths if p.suffix in {".py", ".md", ".toml", ".proto", ".yml", ".yaml", ".json", ".service",
                                             ".cfg", ".txt", ".sh", ""} and p.is_file()]


def test_no_file_points_outside_the_repository() -> None:
    found = []
    for path in _tracked_text_files():
        rel = path.relative_to(ROOT).as_posix()
        if rel == _SELF or rel.startswith("common/pb/"):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if _OUTSIDE.search(line):
                found.append(f"{rel}:{n}: {line.strip()[:120]}")
    assert not found, "references outside the repository:\n" + "\n".join(found)


def test_the_scaling_curves_ship_in_the_package_with_their_licence() -> None:
    data = default_scaling_dir()
    assert data.is_relative_to(ROOT / "coordinator")
    assert (data / "pollux" / "LICENSE").read_text(encoding="utf-8").lstrip().startswith("Apache License")
    assert "Apache" in (data / "README.md").read_text(encoding="utf-8")
    curves = load_curves(data)
    assert set(curves) == set(MODELS)
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert "data/scaling/pollux/*/*.csv" in pyproject
