"""The coordinator's components import each other without cycles, type-only imports included.

Every module under ``coordinator/`` is parsed; each import (also those under ``if TYPE_CHECKING:``
and inside functions) becomes an edge between the units that hold the two modules. A unit is a
sub-package (``coordinator/scheduler/``) or a top-level module (``coordinator/tasks.py``), except in a
feature's home (:data:`FEATURE_HOMES`): it holds modules of several layers (the feature's pure rules, which
the components use, and its leader-side service, which uses them), so each of its modules is a unit
(``coordinator/elastic/rules.py``; its ``__init__`` is the unit ``elastic``). The
composition roots and consumers (``app``, ``server``, ``devcluster``, ``simulator``, ``ctl``, and
``scripts``, the console-script entry points) may import anything, so their outgoing edges are not
part of the graph; no component imports them.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

COORDINATOR = Path(__file__).resolve().parents[3] / "coordinator"
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
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for module in _imported(node, package):
                target = _unit(module)
                if target is not None and target != source:
                    where = f"{path.relative_to(COORDINATOR.parent)}:{node.lineno}"
                    edges[source][target].append(where)
    return edges


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
