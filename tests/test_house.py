"""The shape of the house, checked from the code: a one-way import graph, rooms of a size one
can read, and the process boundary (nothing in the daemon imports the client)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {
    "dflashd.supervisor": ROOT / "supervisor",
    "dflashd.logs": ROOT / "logs",
    "dflashd.trainer": ROOT / "trainer",
}
MAX_MODULE_LINES = 400
MAX_CLASS_LINES = 300


def modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            name = ".".join((package, *parts))
            found[name.removesuffix(".__init__")] = path
    return found


def imports(path: Path, known: dict[str, Path]) -> set[str]:
    """Every dflashd module ``path`` imports: top-level, function-local and TYPE_CHECKING alike."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        out.update(n for n in names if n in known)
    return out


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(path, known) - {name} for name, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in edges[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in edges:
        if node not in index:
            visit(node)
    return found


def test_the_import_graph_has_no_cycle() -> None:
    edges = graph()
    assert len(edges) > 60  # the walk saw the house
    assert cycles(edges) == []


def test_the_cycle_finder_finds_one() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_nothing_in_the_daemon_imports_the_client() -> None:
    edges = graph()
    client = "dflashd.supervisor.client"
    offenders = [
        f"{module} -> {target}"
        for module, targets in edges.items()
        if not module.startswith(client) and not module.endswith("__main__")  # entry points
        for target in targets
        if target.startswith(client)
    ]
    assert offenders == []


def test_rooms_are_of_a_readable_size() -> None:
    too_big: list[str] = []
    for name, path in modules().items():
        text = path.read_text()
        lines = text.count("\n")
        if lines > MAX_MODULE_LINES:
            too_big.append(f"{name}: {lines} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                size = node.end_lineno - node.lineno + 1
                if size > MAX_CLASS_LINES:
                    too_big.append(f"{name}.{node.name}: {size} lines")
    assert too_big == []


def test_no_type_checking_cycle_breakers() -> None:
    """Every import is a real one: no ``if TYPE_CHECKING:`` block hides a dependency."""
    guarded = [name for name, path in modules().items() if "TYPE_CHECKING" in path.read_text()]
    assert guarded == []
