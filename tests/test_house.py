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


MAX_FLOORS = 12  # the longest chain of modules, each importing the next (issue 35)
MAX_CONSTRUCTOR_PARAMS = 7  # in the daemon: a handful of collaborators, no more
# The daemon's state and the one module that writes it (docs/design.md, section 2).
STATE_OWNER = "dflashd.supervisor.core"
STATE_HOLDERS = ("loop", "timers", "ledger", "core")  # core: its current run
STATE_MUTATORS = {
    "loop": {"enter", "end_with"},
    "ledger": {"take"},
    "goodput": {"launched", "ended", "stopping"},
}


def longest_chain(edges: dict[str, set[str]], start: str) -> tuple[str, ...]:
    """The longest import chain from ``start`` down (the graph has no cycle)."""
    memo: dict[str, tuple[str, ...]] = {}

    def down(module: str) -> tuple[str, ...]:
        if module not in memo:
            below = [down(dep) for dep in edges[module]]
            memo[module] = (module, *max(below, key=len, default=()))
        return memo[module]

    return down(start)


def test_the_house_has_at_most_twelve_floors() -> None:
    edges = graph()
    chains = [longest_chain(edges, m) for m in edges if m.startswith("dflashd.supervisor")]
    deepest = max(chains, key=len)
    assert len(deepest) <= MAX_FLOORS, " -> ".join(deepest)


def constructor_widths() -> list[tuple[int, str]]:
    """(parameters besides ``self``, ``module.Class``) of every constructor in the daemon."""
    widths: list[tuple[int, str]] = []
    for name, path in modules().items():
        if not name.startswith("dflashd.supervisor") or ".client" in name:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef):
                continue
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                    count = len(item.args.args) - 1 + len(item.args.kwonlyargs)
                    widths.append((count, f"{name}.{node.name}"))
    return widths


def test_no_constructor_in_the_daemon_takes_more_than_seven_parameters() -> None:
    wide = [
        f"{what}: {count}" for count, what in constructor_widths() if count > MAX_CONSTRUCTOR_PARAMS
    ]
    assert wide == []


def _holder(node: ast.expr) -> str | None:
    """``x.loop``/``x.timers``/``x.ledger`` (or the bare name) written through: its name."""
    if isinstance(node, ast.Attribute):
        inner = node.value
        name = inner.attr if isinstance(inner, ast.Attribute) else getattr(inner, "id", None)
        return name if name in STATE_HOLDERS else None
    return None


def written_targets(node: ast.AST) -> list[ast.expr]:
    """What an assignment writes (a tuple's elements too, ``+=``, an annotated one)."""
    if isinstance(node, ast.Assign):
        return [
            t
            for target in node.targets
            for t in (target.elts if isinstance(target, ast.Tuple) else [target])
        ]
    if isinstance(node, ast.AugAssign | ast.AnnAssign):
        return [node.target]
    return []


def state_writes(tree: ast.AST) -> list[tuple[int, str]]:
    """Every write to the daemon's state in a module: assignments through a state holder,
    its mutating methods, ``setattr`` on one, the core's current run."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        for target in written_targets(node):
            if isinstance(target, ast.Attribute) and (holder := _holder(target)) is not None:
                found.append((line, f"{holder}.{target.attr} ="))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            method, owner = node.func.attr, node.func.value
            owner_name = (
                owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
            )
            if method in STATE_MUTATORS.get(owner_name, set()):
                found.append((line, f"{owner_name}.{method}()"))
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setattr" and node.args:
            first = node.args[0]
            name = first.attr if isinstance(first, ast.Attribute) else getattr(first, "id", "")
            if name in STATE_HOLDERS:
                found.append((line, f"setattr({name}, ...)"))
    return sorted(found)


def test_the_daemons_state_is_written_from_one_module() -> None:
    """LoopState, Timers, the Ledger (and its goodput) and the current run: written by the
    core only; every other room reads them and says what should change as effects."""
    writers: list[str] = []
    for name, path in modules().items():
        if not name.startswith("dflashd.supervisor") or name == STATE_OWNER:
            continue
        for line, what in state_writes(ast.parse(path.read_text())):
            writers.append(f"{name}:{line}: {what}")
    assert writers == []


def test_the_state_write_finder_finds_writes() -> None:
    tree = ast.parse(
        "self.timers.restart_at = 1\n"
        "self.core.timers.stop_deadline, x = None, 2\n"
        "loop.stop_requested = True\n"
        "self.ledger.agent_restarts += 1\n"
        "self.loop.enter(State.RUNNING)\n"
        "ledger.goodput.stopping(now)\n"
        "setattr(self.timers, name, None)\n"
        "self.core.run = run\n"
        "print(self.timers.restart_at)\n"
    )
    assert [line for line, _ in state_writes(tree)] == [1, 2, 3, 4, 5, 6, 7, 8]


def test_one_vocabulary_across_the_boundaries() -> None:
    """AlertKind is every verdict plus ``fatal``, ``recovered`` and ``waiting``; every verdict has its
    colour in the report and every state its colour in the terminal."""
    from dflashd.supervisor.client.htmlreport import VERDICT_COLORS
    from dflashd.supervisor.client.render import STATE_COLOR
    from dflashd.supervisor.decide.verdicts import AlertKind, Verdict
    from dflashd.supervisor.lifecycle import State

    assert {k.value for k in AlertKind} == {v.value for v in Verdict} | {
        "fatal",
        "recovered",
        "waiting",
    }
    assert all(AlertKind[v.name].value == v.value for v in Verdict)
    assert set(Verdict) <= set(VERDICT_COLORS)
    assert set(State) == set(STATE_COLOR)


def test_the_old_flat_names_import_the_moved_modules_and_nothing_here_uses_them() -> None:
    """0.3's ``dflashd.supervisor.<module>`` still imports (code outside the repository),
    as the very module in its room; the repository itself names only the rooms' paths."""
    import importlib
    import re

    from dflashd.supervisor import MOVED_MODULES

    for name, room in MOVED_MODULES.items():
        assert (ROOT / "supervisor" / room / f"{name}.py").is_file(), name
        moved = importlib.import_module(f"dflashd.supervisor.{room}.{name}")
        assert importlib.import_module(f"dflashd.supervisor.{name}") is moved
    old = re.compile(rf"\bdflashd\.supervisor\.({'|'.join(MOVED_MODULES)})\b")
    users = [
        str(path.relative_to(ROOT))
        for folder in ("supervisor", "logs", "trainer", "tests", "entry")
        for path in (ROOT / folder).rglob("*.py")
        if path != ROOT / "supervisor" / "__init__.py"
        and old.search(path.read_text())
        and path != Path(__file__)
    ]
    assert users == []


def run_field_writes(tree: ast.AST) -> set[str]:
    """The fields of a ``Run`` a module writes: ``run.<field> = ...`` (a tuple's elements
    too, ``+=``) and ``run.<field>.add/append/extend/update/clear(...)``."""
    fields: set[str] = set()

    def is_run(node: ast.expr) -> bool:
        return getattr(node, "id", None) == "run" or getattr(node, "attr", None) == "run"

    for node in ast.walk(tree):
        targets = written_targets(node)
        fields |= {t.attr for t in targets if isinstance(t, ast.Attribute) and is_run(t.value)}
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            mutating = node.func.attr in {"add", "append", "extend", "update", "clear"}
            if mutating and isinstance(owner, ast.Attribute) and is_run(owner.value):
                fields.add(owner.attr)
    return fields


def test_every_field_of_a_run_has_one_writer() -> None:
    """Who may set ``run.kill_at_mono``? One module per field (besides ``run.py`` itself):
    the launcher what a launch made, the live run's control its end, the observer and the
    GPU watch the evidence, ``reaped`` the reap, the core the alerts sent."""
    writers: dict[str, set[str]] = {}
    for name, path in modules().items():
        if not name.startswith("dflashd.supervisor") or name == "dflashd.supervisor.run":
            continue
        for field_name in run_field_writes(ast.parse(path.read_text())):
            writers.setdefault(field_name, set()).add(name.rsplit(".", 1)[-1])
    shared = {f: sorted(m) for f, m in writers.items() if len(m) > 1}
    assert shared == {}
    assert writers["kill_at_mono"] == {"liverun"} and writers["reaped"] == {"reaped"}


def test_the_run_write_finder_finds_writes() -> None:
    tree = ast.parse(
        "run.ended_by = why\n"
        "self.run.hang_due, x = None, 1\n"
        "run.gpu_xids.extend(xids)\n"
        "run.progress.on_alive(now)\n"
        "print(run.phase)\n"
    )
    assert run_field_writes(tree) == {"ended_by", "hang_due", "gpu_xids"}
