"""What share of the daemon's behaviour tests are input -> effect tables (issue 42).

    python tests/perf/table_share.py [-v]

A test counts as a *table* when neither it nor a fixture it asks for touches a process, a
file, a pipe, a socket, a thread or a sleep: it feeds a pure function (``step``, a decider)
inputs and reads what comes out.  Every collected case counts (a parametrized row is a test).
The daemon's behaviour is every test of ``dflashd.supervisor`` except the house rules
(imports, docs, packaging, the README); the log path (``dflashd.logs``) and the trainer are
adapters' and the job's tests, outside the share.  Also prints the tables' own wall time.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NOT_THE_DAEMON = {  # the log path, the trainer, and the house's own rules
    "tests/test_trainer.py",
    "tests/test_framer.py",
    "tests/test_linecodec.py",
    "tests/test_records.py",
    "tests/test_writer_reader.py",
    "tests/test_compress_helper.py",
    "tests/test_compress_finish.py",
    "tests/faults/test_writer_faults.py",
    "tests/faults/test_log_damage.py",
    "tests/test_house.py",
    "tests/test_docrefs.py",
    "tests/test_packaging.py",
    "tests/test_readme.py",
}
# names in code (never in strings: a frame called ``time.sleep`` in a table is data)
REAL = {
    "start_daemon",
    "subprocess",
    "run_cli",
    "Popen",
    "tmp_path",
    "tmp_path_factory",
    "home",
    "dflashd",
    "Thread",
    "socket",
    "sleep",
    "child",
    "fork",
    "mkfifo",
    "open",
    "write_text",
    "read_text",
    "write_bytes",
    "read_bytes",
    "Daemon",
    "kill",
    "mkdir",
    "symlink_to",
    "chmod",
    "TCPStore",
    "urlopen",
    "run",
    "wait_event",
    "RotatingLogWriter",
    "read_records",
}


CALLED_ONLY = {"run"}  # a world only where called: ``h.run()``, never ``state.run`` (the facts)


def _touches(node: ast.AST) -> bool:
    """Does this code name something of the world (a process, a file, a socket...)?"""
    called = {id(sub.func) for sub in ast.walk(node) if isinstance(sub, ast.Call)}
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and sub.attr in CALLED_ONLY and id(sub) not in called:
            continue
        name = (
            sub.id
            if isinstance(sub, ast.Name)
            else sub.attr
            if isinstance(sub, ast.Attribute)
            else sub.arg
            if isinstance(sub, ast.arg)
            else None
        )
        if name in REAL:
            return True
    return False


def _real_fixtures(tree: ast.Module) -> set[str]:
    """This file's fixtures whose bodies touch the world."""
    out = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef):
            continue
        fixture = any("fixture" in ast.unparse(d) for d in node.decorator_list)
        if fixture and _touches(node):
            out.add(node.name)
    return out


def classify(path: Path) -> dict[str, bool]:
    """test name -> is it a table (pure)?"""
    tree = ast.parse(path.read_text())
    real_fixtures = _real_fixtures(tree) | {"start_daemon", "tmp_path", "home", "monkeypatch"}
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
            args = {a.arg for a in node.args.args}
            helpers = _called_helpers(tree, node)
            out[node.name] = not (
                args & real_fixtures or _touches(node) or any(map(_touches, helpers))
            )
    return out


def _called_helpers(tree: ast.Module, test: ast.FunctionDef) -> list[ast.FunctionDef]:
    """This file's module-level functions the test calls (one level)."""
    names = {n.id for n in ast.walk(test) if isinstance(n, ast.Name)}
    return [
        n
        for n in tree.body
        if isinstance(n, ast.FunctionDef) and n.name in names and not n.name.startswith("test_")
    ]


def main() -> int:
    verbose = "-v" in sys.argv
    collected = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-n",
            "0",
            "-p",
            "no:cacheprovider",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.splitlines()
    cases = [line for line in collected if "::" in line]
    kinds: Counter[str] = Counter()
    tables: list[str] = []
    by_file: dict[str, dict[str, bool]] = {}
    for case in cases:
        file, name = case.split("::", 1)
        if file in NOT_THE_DAEMON or not file.startswith("tests/"):
            continue
        table = by_file.setdefault(file, classify(ROOT / file)).get(name.split("[", 1)[0], False)
        kinds[file, table] += 1  # type: ignore[index]
        if table:
            tables.append(case)
    total = sum(kinds.values())
    pure = sum(n for (f, t), n in kinds.items() if t)  # type: ignore[misc]
    if verbose:
        for (file, table), n in sorted(kinds.items()):  # type: ignore[misc]
            print(f"{n:4d}  {'table' if table else 'real '}  {file}")
    t0 = time.monotonic()
    ran = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", *tables],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.monotonic() - t0
    print(f"table tests: {pure} of {total} daemon-behaviour tests ({pure / total:.1%})")
    print(f"the tables ran in {wall:.1f}s: {ran.stdout.strip().splitlines()[-1]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
