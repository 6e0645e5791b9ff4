"""Comments that cannot lie after a refactor (issue 35): every Sphinx-style reference in a
docstring (``:mod:``, ``:class:``, ``:func:``, ``:meth:``, ``:data:``, ``:attr:``) resolves to
something that exists, and docs/design.md's table of parts names exactly the supervisor's
modules.

A reference resolves as written (``dflashd.supervisor.model.ending.conclude``), from the module's
package (``ending`` in a supervisor module), or from the module's own names (what it defines
or imports: ``Ledger.take``).
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path
from types import ModuleType
from typing import Any

from dflashd.supervisor.model.rules import RULES
from tests.test_house import ROOT, modules

ROLE = re.compile(r":(mod|class|func|meth|data|attr):`~?([A-Za-z_][\w.]*)`")
_MISSING = object()


def _lookup(start: Any, dotted: str) -> Any:
    value = start
    for part in dotted.split("."):
        value = getattr(value, part, _MISSING)
        if value is _MISSING:
            return _MISSING
    return value


ROOMS = ("decide", "host", "watch", "speak")  # the supervisor's subpackages


def _resolves(module: ModuleType, target: str) -> bool:
    package = module.__name__.rsplit(".", 1)[0]
    parts = tuple(f"dflashd.supervisor.{part}." for part in ROOMS)
    for base in ("", f"{package}.", "dflashd.", "dflashd.supervisor.", *parts):
        name = base + target
        parts = name.split(".")
        for cut in range(len(parts), 0, -1):  # the longest importable module, then attributes
            try:
                found = importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            if found.__name__ != ".".join(parts[:cut]):
                break  # an old name kept for outside code (supervisor/__init__.py): not a reference
            if _lookup(found, ".".join(parts[cut:])) is not _MISSING if parts[cut:] else True:
                return True
            break
    return _lookup(module, target) is not _MISSING


def _docstrings(path: Path) -> list[tuple[int, str, str | None]]:
    """(line, docstring, the enclosing class's name) of the module, its classes and functions."""
    found: list[tuple[int, str, str | None]] = []

    def visit(node: ast.AST, owner: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                text = ast.get_docstring(child, clean=False)
                inner = child.name if isinstance(child, ast.ClassDef) else owner
                if text:
                    found.append((child.lineno, text, inner))
                visit(child, inner)

    tree = ast.parse(path.read_text())
    if text := ast.get_docstring(tree, clean=False):
        found.append((1, text, None))
    visit(tree, None)
    return found


def test_every_docstring_reference_resolves() -> None:
    broken = []
    for name, path in sorted(modules().items()):
        if name.endswith("__main__"):
            continue
        module = importlib.import_module(name)
        for line, text, owner in _docstrings(path):
            for role, target in ROLE.findall(text):
                scoped = owner is not None and _lookup(module, f"{owner}.{target}") is not _MISSING
                if not scoped and not _resolves(module, target):
                    broken.append(f"{path.relative_to(ROOT)}:{line}: :{role}:`{target}`")
    assert broken == [], "\n".join(broken)


def test_the_design_table_names_the_supervisors_modules() -> None:
    """Every module of supervisor/ (its parts' folders and client/ too, by path) is in the table, and the table names no
    module that is gone."""
    design = (ROOT / "docs" / "design.md").read_text()
    table = design.split("| when | part | module | what it holds |", 1)[1].split("\n\n", 1)[0]
    modules_column = [row.split("|")[3] for row in table.splitlines() if row.count("|") > 4]
    named = {name for cell in modules_column for name in re.findall(r"`([a-z_/]+\.py)`", cell)}
    folder = ROOT / "supervisor"
    skip = {"__init__.py", "__main__.py"}
    present = {str(p.relative_to(folder)) for p in folder.rglob("*.py") if p.name not in skip}
    # a rule's own module is named by the table's row of rule verdicts, through the registry
    rules = {f"model/{r.reads.__module__.rsplit('.', 1)[-1]}.py" for r in RULES}
    named |= rules if "a rule's own module" in table else set()
    assert sorted(present - named) == [], "in supervisor/ but not in docs/design.md's table"
    assert sorted(named - present) == [], "in docs/design.md's table but not in supervisor/"
