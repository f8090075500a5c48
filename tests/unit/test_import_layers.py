"""Import layers: no import cycle anywhere in the tree, components layered, and ``common/`` only what the agent shares.

Three graphs, each built by parsing the source (no import runs):

**Modules** (:func:`module_graph`): every module of ``agent/``, ``common/`` and ``coordinator/``, sub-packages
and the simulator included, with the imports that run when it is imported: its module-level imports,
also those under ``if``/``try``/``with`` and in class bodies, but not those inside functions (they run
when called) nor those under ``if TYPE_CHECKING:`` (they never run). Importing ``a.b.c`` runs ``a`` and
``a.b`` first unless the importer lives inside them (they are then already running), so those packages
are edges too. No cycle is allowed: a cycle is a module that may see another half-initialized.

**Components** (:func:`import_graph`): every module under ``coordinator/`` is parsed; each import (also
those under ``if TYPE_CHECKING:`` and inside functions) becomes an edge between the units that hold the
two modules. A unit is a sub-package (``coordinator/scheduler/``) or a top-level module
(``coordinator/tasks.py``), except in a feature's home (:data:`FEATURE_HOMES`): it holds modules of
several layers (the feature's pure rules, which the components use, and its leader-side service, which
uses them), so each of its modules is a unit (``coordinator/elastic/rules.py``; its ``__init__`` is the
unit ``elastic``). The composition roots and consumers (``app``, ``server``, ``devcluster``,
``simulator``, ``ctl``, and ``scripts``, the console-script entry points) may import anything, so their
outgoing edges are not part of the graph; no component imports them.

**The agent's share** (:func:`agent_closure`): the base install is the agent's, and ``common/`` is what
the agent and the coordinator share. Every module of ``common/`` is one the agent imports (any import,
lazy ones included), so no coordinator-only code sits there; the generated protobuf package
(``common/pb``, one wire contract for both sides) is the exception. Neither ``agent/`` nor ``common/``
imports ``coordinator/``.

**Private modules and etcd**: a module whose name starts with ``_`` (``coordinator/sync/_fenced.py``) is
imported only inside its package, and only ``coordinator/sync/`` imports the etcd client.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterable, Iterator
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COORDINATOR = ROOT / "coordinator"
PACKAGES = ("agent", "common", "coordinator")
GENERATED = "common.pb"
ROOTS = frozenset({"app", "server", "devcluster", "simulator", "ctl", "scripts"})
FEATURE_HOMES = frozenset({"elastic", "queues"})

Edges = dict[str, dict[str, list[str]]]


def _unit(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "coordinator" or len(parts) < 2:
        return None
    if parts[1] in FEATURE_HOMES:
        return ".".join(p for p in parts[1:3] if p != "__init__")
    return parts[1]


def _imported(node: ast.Import | ast.ImportFrom, package: list[str]) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        base = package[:len(package) - (node.level - 1)]
        module = ".".join(base + ([node.module] if node.module else []))
    else:
        module = node.module or ""
    if node.module:
        return [module]
    return [f"{module}.{alias.name}" for alias in node.names]


def import_graph() -> Edges:
    """unit -> imported unit -> the ``path:line`` of each import behind the edge."""
    edges: Edges = defaultdict(lambda: defaultdict(list))
    for path in sorted(COORDINATOR.rglob("*.py")):
        parts = list(path.relative_to(COORDINATOR.parent).with_suffix("").parts)
        package = parts[:-1]
        source = _unit(".".join(parts))
        if source is None or source == "__init__" or source in ROOTS:
            continue
        for node in ast.walk(parsed(path)):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for module in _imported(node, package):
                target = _unit(module)
                if target is not None and target != source:
                    where = f"{path.relative_to(COORDINATOR.parent)}:{node.lineno}"
                    edges[source][target].append(where)
    return edges


Modules = dict[str, tuple[Path, bool]]


@cache
def parsed(path: Path) -> ast.Module:
    """The file's syntax tree (parsed once per test session)."""
    return ast.parse(path.read_text(), filename=str(path))


def all_modules() -> Modules:
    """Every module of :data:`PACKAGES`: its dotted name -> (its file, whether it is a package's ``__init__``)."""
    found: Modules = {}
    for top in PACKAGES:
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            package = parts[-1] == "__init__"
            found[".".join(parts[:-1] if package else parts)] = (path, package)
    return found


def _type_checking(test: ast.expr) -> bool:
    return ((isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
            or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def run_on_import(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements of ``body`` that run when its module is imported (see the module docstring)."""
    for stmt in body:
        if isinstance(stmt, ast.Import | ast.ImportFrom):
            yield stmt
        elif isinstance(stmt, ast.If):
            if not _type_checking(stmt.test):
                yield from run_on_import(stmt.body)
            yield from run_on_import(stmt.orelse)
        elif isinstance(stmt, ast.Try | ast.TryStar):
            for block in (stmt.body, *(h.body for h in stmt.handlers), stmt.orelse, stmt.finalbody):
                yield from run_on_import(block)
        elif isinstance(stmt, ast.With | ast.For | ast.While):
            yield from run_on_import(stmt.body)
            yield from run_on_import(getattr(stmt, "orelse", []))
        elif isinstance(stmt, ast.ClassDef):
            yield from run_on_import(stmt.body)


def _ancestors(module: str) -> set[str]:
    parts = module.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def module_imports(name: str, package: bool, nodes: Iterable[ast.Import | ast.ImportFrom],
                   modules: Modules) -> dict[str, list[int]]:
    """The modules of ``modules`` that ``nodes`` (import statements of module ``name``) load -> their lines.

    ``from X import y`` loads ``X.y`` when that is a module, else ``X``; importing a module loads the packages
    above it too, except those ``name`` lives in (they are already being imported when it runs).
    """
    here = name.split(".") if package else name.split(".")[:-1]
    running = _ancestors(name) | ({name} if package else set())
    found: dict[str, list[int]] = defaultdict(list)
    for node in nodes:
        if isinstance(node, ast.Import):
            imported = [alias.name for alias in node.names]
        else:
            base = here[:len(here) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            submodules = [f"{module}.{a.name}" for a in node.names if f"{module}.{a.name}" in modules]
            imported = submodules + ([module] if len(submodules) < len(node.names) else [])
        for target in imported:
            for loaded in {target} | (_ancestors(target) - running):
                if loaded in modules and loaded != name:
                    found[loaded].append(node.lineno)
    return found


def module_graph(modules: Modules | None = None) -> Edges:
    """module -> module it loads when imported -> the ``path:line`` of each import behind the edge."""
    modules = all_modules() if modules is None else modules
    edges: Edges = defaultdict(lambda: defaultdict(list))
    for name, (path, package) in modules.items():
        for target, lines in module_imports(name, package, run_on_import(parsed(path).body), modules).items():
            edges[name][target].extend(f"{path.relative_to(ROOT)}:{line}" for line in lines)
    return edges


def _every_import(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    return (node for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom))


def agent_closure(modules: Modules) -> set[str]:
    """Every module the agent's code may load: ``agent.*`` and what it imports, transitively, lazy and
    type-only imports included, with the packages above each."""
    seen: set[str] = set()
    todo = [name for name in modules if name.split(".")[0] == "agent"]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        path, package = modules[name]
        loaded = module_imports(name, package, _every_import(parsed(path)), modules)
        todo.extend(loaded)
        todo.extend(_ancestors(name) & modules.keys())
    return seen


def find_cycle(edges: Edges) -> list[str] | None:
    """One cycle of the graph as ``[a, b, ..., a]``, or None."""
    done: set[str] = set()
    path: list[str] = []

    def visit(unit: str) -> list[str] | None:
        if unit in path:
            return [*path[path.index(unit):], unit]
        if unit in done:
            return None
        path.append(unit)
        for target in sorted(edges.get(unit, {})):
            cycle = visit(target)
            if cycle:
                return cycle
        path.pop()
        done.add(unit)
        return None

    for start in sorted(edges):
        cycle = visit(start)
        if cycle:
            return cycle
    return None


def edges_on_cycles(edges: Edges) -> list[str]:
    """Every edge ``a -> b`` where ``b`` reaches back to ``a``, with the imports behind it."""
    def reach(unit: str) -> set[str]:
        seen: set[str] = set()
        todo = [unit]
        while todo:
            for target in edges.get(todo.pop(), {}):
                if target not in seen:
                    seen.add(target)
                    todo.append(target)
        return seen

    return [f"  {a} -> {b}: {', '.join(edges[a][b])}"
            for a in sorted(edges) for b in sorted(edges[a]) if a in reach(b)]


def test_the_graph_sees_components_and_type_only_imports() -> None:
    edges = import_graph()
    assert {"scheduler", "dispatch", "qos", "tasks"} <= set(edges)
    assert not ROOTS & set(edges)
    # an import under ``if TYPE_CHECKING:`` is an edge like any other
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from coordinator.tasks import T\n")
    found = [m for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for m in _imported(n, ["coordinator", "x"])]
    assert "coordinator.tasks" in found


def test_find_cycle_reports_the_cycle() -> None:
    assert find_cycle({"a": {"b": []}, "b": {"c": []}, "c": {"a": []}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b": []}, "b": {"c": []}}) is None


def test_component_packages_import_each_other_without_cycles() -> None:
    edges = import_graph()
    cycle = find_cycle(edges)
    if cycle:
        raise AssertionError("import cycle " + " -> ".join(cycle) + "; every edge on a cycle:\n"
                             + "\n".join(edges_on_cycles(edges)))


def test_components_do_not_import_the_composition_roots() -> None:
    edges = import_graph()
    found = [f"  {a} -> {b}: {', '.join(edges[a][b])}" for a in sorted(edges) for b in sorted(edges[a]) if b in ROOTS]
    assert not found, "components import a composition root:\n" + "\n".join(found)


def test_the_module_graph_counts_only_imports_that_run_on_import() -> None:
    source = """
from typing import TYPE_CHECKING
import agent.daemon
if TYPE_CHECKING:
    from coordinator.tasks import TaskTable
try:
    from common import errors
except ImportError:
    errors = None
class Late:
    from coordinator.elastic import rules
def lazy():
    from coordinator import server
"""
    modules = all_modules()
    nodes = run_on_import(ast.parse(source).body)
    assert set(module_imports("outside", False, nodes, modules)) == {
        "agent", "agent.daemon", "common", "common.errors", "coordinator", "coordinator.elastic",
        "coordinator.elastic.rules"}
    # a module does not load the packages it lives in: they are already being imported
    nodes = run_on_import(ast.parse("from coordinator.queues import planning, admission\n").body)
    assert set(module_imports("coordinator.queues.admin", False, nodes, modules)) == {
        "coordinator.queues.planning", "coordinator.queues.admission"}
    # ... but a name taken from one of them needs its __init__ to have run
    nodes = run_on_import(ast.parse("from . import QueueConfig\n").body)
    assert set(module_imports("coordinator.queues.admin", False, nodes, modules)) == {"coordinator.queues"}


def test_no_import_cycle_anywhere_in_the_tree() -> None:
    """agent/, common/ and coordinator/, every sub-package and the simulator: no module loads itself back."""
    edges = module_graph()
    assert {"agent.daemon", "common.config", "coordinator.simulator.engine", "coordinator.elastic.rules",
            "coordinator.queues.planning", "coordinator.sync.quarantine"} <= set(edges)
    cycle = find_cycle(edges)
    if cycle:
        raise AssertionError("import cycle " + " -> ".join(cycle) + "; every edge on a cycle:\n"
                             + "\n".join(edges_on_cycles(edges)))


def test_a_cycle_between_two_modules_is_found(tmp_path: Path) -> None:
    for name, body in (("a", "from pkg.b import x\n"), ("b", "from pkg import a\nx = 1\n"),
                       ("__init__", "")):
        (tmp_path / f"{name}.py").write_text(body)
    modules = {"pkg": (tmp_path / "__init__.py", True), "pkg.a": (tmp_path / "a.py", False),
               "pkg.b": (tmp_path / "b.py", False)}
    edges: Edges = {name: {t: [] for t in module_imports(name, package, run_on_import(
        ast.parse(path.read_text()).body), modules)} for name, (path, package) in modules.items()}
    assert find_cycle(edges) == ["pkg.a", "pkg.b", "pkg.a"]


def test_common_holds_only_what_the_agent_shares() -> None:
    """Every module of common/ is one the agent loads: coordinator-only code lives in coordinator/."""
    modules = all_modules()
    closure = agent_closure(modules)
    assert {"agent.daemon", "common.errors", "common.config"} <= closure
    unshared = sorted(name for name in modules if name.split(".")[0] == "common" and name not in closure
                      and name != GENERATED and not name.startswith(GENERATED + "."))
    assert not unshared, f"modules of common/ the agent never imports (move them into coordinator/): {unshared}"


def test_neither_the_agent_nor_common_imports_the_coordinator() -> None:
    modules = all_modules()
    found = [f"{path.relative_to(ROOT)}:{line} imports {target}"
             for name, (path, package) in modules.items() if name.split(".")[0] in ("agent", "common")
             for target, lines in module_imports(name, package, _every_import(parsed(path)),
                                                 modules).items()
             if target.split(".")[0] == "coordinator" for line in lines]
    assert not found, "\n".join(found)


def test_private_modules_are_imported_only_inside_their_package() -> None:
    """``coordinator/sync/_fenced.py`` and the like are their package's own: nothing outside it imports them."""
    modules = all_modules()
    found = []
    for name, (path, package) in modules.items():
        for target, lines in module_imports(name, package, _every_import(parsed(path)), modules).items():
            parent, _, leaf = target.rpartition(".")
            private = leaf.startswith("_") and not leaf.startswith("__")
            if private and name != parent and not name.startswith(parent + "."):
                found += [f"{path.relative_to(ROOT)}:{line} imports {target}" for line in lines]
    assert not found, "\n".join(found)


def _absolute_names(node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    return [node.module] if node.module and not node.level else []


def test_only_sync_talks_to_etcd() -> None:
    """The etcd client library is imported by coordinator/sync/ only (CONTRIBUTING's layout)."""
    found = [f"{path.relative_to(ROOT)}:{node.lineno}"
             for name, (path, _) in all_modules().items() if not name.startswith("coordinator.sync.")
             for node in _every_import(parsed(path))
             if any(module.split(".")[0] == "etcd3" for module in _absolute_names(node))]
    assert not found, "the etcd client imported outside coordinator/sync/: " + ", ".join(found)
