"""The shape of the house, checked from the code: a one-way import graph, parts of a size one
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


MAX_FLOORS = 9  # the longest chain of modules, each importing the next, anywhere (issue 52)
MAX_DAEMON_FLOORS = 9  # ...from the daemon program down (issue 42)
MAX_CONSTRUCTOR_PARAMS = 7  # in the daemon: a handful of collaborators, no more
# The daemon's state: values, replaced by the model's step; only the core keeps the new one.
STATE_OWNER = "dflashd.supervisor.core"
STATE_HOLDERS = ("loop", "deadlines", "ledger", "goodput", "state", "core")  # core: its run
STATE_MUTATORS: dict[str, set[str]] = {}  # none: every change returns a new value


def longest_chain(edges: dict[str, set[str]], start: str) -> tuple[str, ...]:
    """The longest import chain from ``start`` down (the graph has no cycle)."""
    memo: dict[str, tuple[str, ...]] = {}

    def down(module: str) -> tuple[str, ...]:
        if module not in memo:
            below = [down(dep) for dep in edges[module]]
            memo[module] = (module, *max(below, key=len, default=()))
        return memo[module]

    return down(start)


def test_the_house_has_at_most_nine_floors() -> None:
    edges = graph()
    chains = [longest_chain(edges, m) for m in edges if m.startswith("dflashd.supervisor")]
    deepest = max(chains, key=len)
    assert len(deepest) <= MAX_FLOORS, " -> ".join(deepest)
    daemon = longest_chain(edges, "dflashd.supervisor.daemon")
    assert len(daemon) <= MAX_DAEMON_FLOORS, " -> ".join(daemon)


# The daemon program and what only it runs: the client becomes it by exec (host/handover.py)
DAEMON_PROGRAM = ("dflashd.supervisor.daemon", "dflashd.supervisor.foreground")


def reachable(edges: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(edges[module])
    return seen


def test_the_client_never_loads_the_daemon_program() -> None:
    """Two programs, as supervisorctl and supervisord: ``dflashd``'s commands reach neither the
    daemon program nor its loop's modules, directly or through another module."""
    edges = graph()
    loaded = reachable(edges, "dflashd.supervisor.__main__")
    assert "dflashd.supervisor.client.cli" in loaded  # the walk saw the client
    assert sorted(loaded & {*DAEMON_PROGRAM, "dflashd.supervisor.core"}) == []
    assert "dflashd.supervisor.foreground" in reachable(edges, "dflashd.supervisor.daemon")


def layer(module: str) -> str | None:
    """The folder (layer) a module of the supervisor sits in; None: the package itself (its
    version) and ``__main__`` (the entry point, which only calls the client)."""
    parts = module.split(".")
    if parts[:2] != ["dflashd", "supervisor"] or len(parts) == 2 or parts[2] == "__main__":
        return None
    return parts[2] if len(parts) > 3 else "shell"


def test_the_model_imports_only_the_standard_library_and_itself() -> None:
    import sys

    outside: list[str] = []
    for name, path in modules().items():
        if not name.startswith("dflashd.supervisor.model"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            found = [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            found += [a.name for a in node.names] if isinstance(node, ast.Import) else []
            for imported in found:
                ours = imported.startswith("dflashd.supervisor.model")
                if imported.split(".")[0] not in sys.stdlib_module_names and not ours:
                    outside.append(f"{name} -> {imported}")
    assert len([m for m in modules() if m.startswith("dflashd.supervisor.model.")]) > 15
    assert outside == []


def test_no_two_folders_import_each_other() -> None:
    """The layers: the model below the adapters (host, watch, speak, in that order), the
    shell above them, the client on top; an import goes one way between any two folders."""
    edges = graph()
    pairs = {
        (layer(m), layer(t))
        for m, targets in edges.items()
        for t in targets
        if layer(m) and layer(t) and layer(m) != layer(t)
    }
    both = sorted(f"{a} <-> {b}" for a, b in pairs if (b, a) in pairs and str(a) < str(b))
    assert {x for pair in pairs for x in pair} >= {
        "model",
        "host",
        "watch",
        "speak",
        "shell",
        "client",
    }
    assert both == []


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


def test_the_daemons_state_is_a_value_replaced_by_the_model() -> None:
    """DaemonState, LoopState, the deadline table, the Ledger and its goodput are frozen: no
    field is assigned after construction anywhere; ``step`` returns the next state, and the
    core alone keeps it (``self.state = ...``)."""
    import dataclasses

    from dflashd.supervisor.model.deadlines import Deadlines
    from dflashd.supervisor.model.goodput import GoodputLedger
    from dflashd.supervisor.model.ledger import Ledger
    from dflashd.supervisor.model.lifecycle import LoopState
    from dflashd.supervisor.model.step import DaemonState, Rules

    for value in (DaemonState(), LoopState(), Deadlines(), Ledger(), GoodputLedger(0.0), Rules()):
        field = dataclasses.fields(value)[0].name
        try:
            setattr(value, field, None)
        except dataclasses.FrozenInstanceError:
            continue
        raise AssertionError(f"{type(value).__name__} can be changed in place")
    writers: list[str] = []
    for name, path in modules().items():
        if not name.startswith("dflashd.supervisor") or ".client" in name:
            continue
        for line, what in state_writes(ast.parse(path.read_text())):
            if not (name == STATE_OWNER and what in ("core.run =", "core.state =")):
                writers.append(f"{name}:{line}: {what}")
    assert writers == []


def test_the_state_write_finder_finds_writes() -> None:
    tree = ast.parse(
        "self.deadlines.restart_at = 1\n"
        "self.core.deadlines.stop_at, x = None, 2\n"
        "loop.stop_requested = True\n"
        "self.ledger.agent_restarts += 1\n"
        "self.state.deadlines.hang_at = 3\n"
        "ledger.goodput.closed = c\n"
        "setattr(self.deadlines, name, None)\n"
        "self.core.run = run\n"
        "print(self.deadlines.restart_at)\n"
    )
    assert [line for line, _ in state_writes(tree)] == [1, 2, 3, 4, 5, 6, 7, 8]


def test_one_vocabulary_across_the_boundaries() -> None:
    """An alert is about a verdict or a notice (``fatal``, ``recovered``, ``waiting``): AlertKind
    is derived, never repeated; every verdict has its colour in the report and every state
    its colour in the terminal."""
    from dflashd.supervisor.client.render import STATE_COLOR
    from dflashd.supervisor.client.reportdata import VERDICT_COLORS
    from dflashd.supervisor.model.lifecycle import State
    from dflashd.supervisor.model.verdicts import ALERT_KINDS, Verdict, alert_kind

    assert {k.value for k in ALERT_KINDS} == {v.value for v in Verdict} | {
        "fatal",
        "recovered",
        "waiting",
        "slow",
        "gpu_unusable",
    }
    assert all(alert_kind(v.value) is v for v in Verdict)  # the very same member
    assert set(Verdict) <= set(VERDICT_COLORS)
    assert set(State) == set(STATE_COLOR)


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


def test_a_runs_facts_are_a_value_replaced_by_the_model() -> None:
    """What is known of a run (its progress, evidence, who ended it) is a frozen ``RunState``
    in the daemon's state, replaced by ``step`` only; the shell's ``Run`` holds handles, and
    the one change made to it after construction is the reap (``reaped``, by ``reaped``)."""
    import dataclasses

    from dflashd.supervisor.model.runstate import RunFacts, RunState
    from dflashd.supervisor.watch.run import Run
    from tests.tables import run_state

    for value in (run_state(0.0), RunFacts(1, None, 0.0)):  # type: ignore[arg-type]
        try:
            value.run_no = 2
        except dataclasses.FrozenInstanceError:
            continue
        raise AssertionError(f"{type(value).__name__} can be changed in place")
    facts = {f.name for f in dataclasses.fields(RunState)}
    writers: dict[str, set[str]] = {}
    for name, path in modules().items():
        if not name.startswith("dflashd.supervisor") or name == "dflashd.supervisor.watch.run":
            continue
        for field_name in run_field_writes(ast.parse(path.read_text())):
            writers.setdefault(field_name, set()).add(name.rsplit(".", 1)[-1])
    assert writers == {"reaped": {"reaped"}}
    assert facts & {f.name for f in dataclasses.fields(Run)} == {"run_no"}  # nothing twice


def test_the_live_runs_deciders_are_called_from_steps_arms_only() -> None:
    """The live run's deciders are the model's: the hang and start-up deciders, the stall
    decider, the no-GPU-memory rule, and what evidence means (a step, a datagram, liveness,
    a restart inside the run, the agent's view, a recovery) are called in ``model/`` only: the
    shell reads, ``step``'s arms decide (issue 52)."""
    deciders = {"stall_decide", "stall_reason", "holds_no_gpu_memory", "startup_decide"}
    deciders |= {"on_step", "on_notify", "on_alive", "workers_restarting", "recorded_now"}
    deciders |= {"resumed", "running", "paced", "watched"}  # AgentView.took: Ledger.took, too
    callers: dict[str, set[str]] = {}
    for name, path in modules().items():
        if not name.startswith("dflashd.supervisor") or ".model." in name:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                called = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                if called in deciders:
                    callers.setdefault(str(called), set()).add(name)
    assert callers == {}


def test_the_run_write_finder_finds_writes() -> None:
    tree = ast.parse(
        "run.ended_by = why\n"
        "self.run.hang_due, x = None, 1\n"
        "run.gpu_xids.extend(xids)\n"
        "run.progress.on_alive(now)\n"
        "print(run.phase)\n"
    )
    assert run_field_writes(tree) == {"ended_by", "hang_due", "gpu_xids"}


# The executor and its hands: the only modules that act (issue 42).  ``core`` is the one
# executor; ``runs`` its hands for a run's life, which call the launcher (the spawn record
# must be on disk before the fork), the ended runs' room and the dumps; ``reporter``/``custody``
# are the implementations of a record and of a signal.
ACTORS = {
    "dflashd.supervisor.core",
    "dflashd.supervisor.runs",
    "dflashd.supervisor.launcher",
    "dflashd.supervisor.endedruns",
    "dflashd.supervisor.speak.reporter",
    "dflashd.supervisor.host.custody",
    "dflashd.supervisor.watch.stackdumps",  # a native dump's own SIGCONT, in its thread
    "dflashd.supervisor.publisher",  # the status's one writer: the executor's Publish, and the
    # loop's throttled write, a client's status and the close through it
    # start-up, before the loop's first turn: what a dead daemon left is proven ours and ended
    # (host/recovery.py) before anything is carried over; it has no run to act through yet
    "dflashd.supervisor.carryover",
}
ACTS = {
    "record",
    "record_history",
    "alert",
    "signal_group",
    "signal_root",
    "signal_pid",
    "kill_all",
    "launch",
    "start_dump",
    "signal_all",
    "recover",
    "notify",
    "publish",
    "save_goodput",
    "end_stale_cgroup",
}


def acts(tree: ast.AST) -> list[tuple[int, str]]:
    """Calls that record, alert, signal, launch or dump: ``<x>.record(...)`` and the like,
    and ``<x>.dumps.start/sample(...)``."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        method, owner = node.func.attr, node.func.value
        owner_name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
        dumps = owner_name == "dumps" and method in ("start", "sample")
        valued = method == "record" and not node.args  # Cost.record(): a value, not an act
        if (method in ACTS and not valued) or dumps:
            found.append((node.lineno, f"{owner_name}.{method}()"))
    return found


def test_outside_the_executor_nothing_records_signals_launches_dumps_or_alerts() -> None:
    outside: list[str] = []
    for name, path in modules().items():
        if not name.startswith("dflashd.supervisor") or ".client" in name or name in ACTORS:
            continue
        for line, what in acts(ast.parse(path.read_text())):
            outside.append(f"{name}:{line}: {what}")
    assert outside == []


def test_the_act_finder_finds_acts() -> None:
    tree = ast.parse(
        "self.reporter.record(1, e)\n"
        "run.custody.kill_all()\n"
        "self.dumps.sample(run)\n"
        "self.launcher.launch(run)\n"
        "custody.signal_group(15)\n"
        "progress.on_step(1)\n"
    )
    assert [line for line, _ in acts(tree)] == [1, 2, 3, 4, 5]


def test_no_two_classes_share_a_name() -> None:
    """One name, one class, across the supervisor and the log path (issue 52: two ``Launched``,
    two ``Incident``, two ``Frame`` and two ``Leftovers`` once read as one)."""
    where: dict[str, list[str]] = {}
    for name, path in modules().items():
        if not name.startswith(("dflashd.supervisor", "dflashd.logs")):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                where.setdefault(node.name, []).append(name)
    assert {cls: found for cls, found in where.items() if len(found) > 1} == {}


# Where the daemon may write a file: the executor and its hands (ACTORS), and the adapters that
# implement an act (host/: the home, caches, cgroups, custody; speak/: records, status, alerts,
# sockets).  The loop's wake pipe and the command's one line to stderr (a Ctrl-C while it
# loads: the package's ``__init__``) are not files.
WRITERS_BESIDE = {"dflashd.supervisor.inbox", "dflashd.supervisor"}
WRITES = {"write_text", "write_bytes", "replace", "unlink", "rmtree", "write", "write_state"}
OS_ONLY = {"replace", "write"}  # os.replace, os.write (dataclasses' replace is no write)


def file_writes(tree: ast.AST) -> list[tuple[int, str]]:
    """Calls that write, replace or remove a file (``open`` for writing, too)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = getattr(node.func, "attr", None) or getattr(node.func, "id", None)
        owner = getattr(getattr(node.func, "value", None), "id", None)
        if name in WRITES and (name not in OS_ONLY or owner in ("os", "_os")):
            found.append((node.lineno, f"{name}()"))
        elif name in ("open", "fdopen") and any(
            isinstance(a, ast.Constant) and isinstance(a.value, str) and set(a.value) & set("wax+")
            for a in (*node.args[1:2], *(k.value for k in node.keywords if k.arg == "mode"))
        ):
            found.append((node.lineno, f"{name}(..., write)"))
        elif name == "open" and any(
            isinstance(a, ast.Attribute) and a.attr in ("O_WRONLY", "O_RDWR", "O_CREAT")
            for a in ast.walk(node)
        ):
            found.append((node.lineno, "os.open(..., write)"))
    return found


def test_outside_the_executor_and_its_adapters_nothing_writes_a_file() -> None:
    """The model, the watchers and the loop's shell read; a file of the home (a record, the
    status, a dump, a cache) is written by the executor's hands or the adapter that implements
    the act, never by the code that decides or reads (issue 52)."""
    outside: list[str] = []
    for name, path in modules().items():
        parts = name.split(".")
        if parts[:2] != ["dflashd", "supervisor"] or name in ACTORS | WRITERS_BESIDE:
            continue
        if len(parts) > 3 and parts[2] in ("host", "speak", "client"):
            continue
        for line, what in file_writes(ast.parse(path.read_text())):
            outside.append(f"{name}:{line}: {what}")
    assert outside == []


def test_the_file_write_finder_finds_writes() -> None:
    tree = ast.parse(
        "p.write_text('x')\n"
        "open(p, 'a')\n"
        "os.open(p, os.O_WRONLY | os.O_CREAT)\n"
        "shutil.rmtree(d)\n"
        "open(p, 'rb')\n"
        "p.read_text()\n"
        "replace(facts, step=1)\n"
        "os.replace(a, b)\n"
    )
    assert [line for line, _ in file_writes(tree)] == [1, 2, 3, 4, 8]
