"""The import graph of the four packages: who may import whom, and no import circles.

Every module of ``contract/``, ``engine/``, ``oracle/`` and ``parity/`` is parsed with ``ast``
(nothing is imported); its ``import`` statements, at module level and inside functions, become
edges to the project's modules they name (``from a.b import c`` names ``a.b.c`` when that is a
module, else ``a.b``). Imports under ``if TYPE_CHECKING:`` are left out: they never run.

Rules (README "Layout"): ``contract`` imports none of the others; ``engine`` imports neither
``parity`` nor ``oracle``; ``oracle`` imports neither ``engine`` nor ``parity``; no cycle
within ``engine``, ``oracle`` or ``contract``. Cycles within ``parity`` are printed, not
asserted (``-s`` shows them).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("contract", "engine", "oracle", "parity")
ACYCLIC = ("contract", "engine", "oracle")
FORBIDDEN = {
    "contract": {"engine", "oracle", "parity"},
    "engine": {"oracle", "parity"},
    "oracle": {"engine", "parity"},
}

Graph = dict[str, set[str]]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def _import_nodes(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import under ``node``, skipping the bodies of ``if TYPE_CHECKING:``."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child
        elif isinstance(child, ast.If) and _is_type_checking(child.test):
            for other in child.orelse:
                yield from _import_nodes(ast.Module(body=[other], type_ignores=[]))
        else:
            yield from _import_nodes(child)


def _resolve(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base.pop()
    if node.level > 1:
        base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imported_modules(path: Path, modules: set[str]) -> set[str]:
    """The project modules ``path`` imports (outside TYPE_CHECKING blocks)."""
    module = module_name(path)
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: set[str] = set()
    for node in _import_nodes(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            base = _resolve(node, module, path.name == "__init__.py")
            names = [f"{base}.{alias.name}" for alias in node.names]
            names = [name if name in modules else base for name in names]
        found.update(name for name in names if name in modules)
    found.discard(module)
    return found


def build_graph() -> Graph:
    paths = [p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))]
    modules = {module_name(p) for p in paths}
    return {module_name(p): imported_modules(p, modules) for p in paths}


def cycles(graph: Graph, package: str) -> list[list[str]]:
    """The strongly connected components (more than one module) of ``package``'s subgraph."""
    nodes = [m for m in graph if m.split(".")[0] == package]
    inside = set(nodes)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph[node] & inside):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(nodes):
        if node not in index:
            visit(node)
    return sorted(found)


@pytest.fixture(scope="module")
def graph() -> Graph:
    return build_graph()


def test_the_parser_sees_imports(graph: Graph) -> None:
    """The graph is not empty by accident: known edges are found, TYPE_CHECKING ones are not."""
    assert "contract.trace" in graph["engine.core.step_trace"]
    assert "engine.core.scheduler_tier" in graph["parity.targets.engine"]
    assert len(graph) > 100


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_layering(graph: Graph, package: str) -> None:
    bad = sorted(
        f"{module} imports {target}"
        for module, targets in graph.items()
        if module.split(".")[0] == package
        for target in targets
        if target.split(".")[0] in FORBIDDEN[package]
    )
    assert not bad, bad


@pytest.mark.parametrize("package", ACYCLIC)
def test_no_import_cycles(graph: Graph, package: str) -> None:
    assert cycles(graph, package) == []


def test_parity_cycles_are_listed(graph: Graph) -> None:
    """Reported, not asserted: parity/ has its own owner."""
    for component in cycles(graph, "parity"):
        print("parity import cycle:", " <-> ".join(component))


def test_cycle_finder_finds_a_cycle() -> None:
    toy: Graph = {"p.a": {"p.b"}, "p.b": {"p.c"}, "p.c": {"p.a"}, "p.d": {"p.a"}}
    assert cycles(toy, "p") == [["p.a", "p.b", "p.c"]]
