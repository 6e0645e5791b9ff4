"""The house seen from its imports (issue 35): the floors (the longest chain of dflashd modules,
each importing the next), for the whole package and for the daemon's side, and the
four widest constructors of the daemon (parameters besides ``self``).

    python tests/perf/house_floors.py
"""

from __future__ import annotations

import ast
import functools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.test_house import graph, modules

EDGES = graph()


@functools.cache
def chain(module: str) -> tuple[str, ...]:
    """The longest import chain from ``module`` down."""
    below = [chain(dep) for dep in EDGES[module]]
    return (module, *max(below, key=len, default=()))


def main() -> int:
    supervisor = [m for m in EDGES if m.startswith("dflashd.supervisor")]
    daemon_side = [m for m in supervisor if ".client" not in m and not m.endswith("__main__")]
    for label, pool in (("floors", supervisor), ("daemon side", daemon_side)):
        longest = chain(max(pool, key=lambda m: len(chain(m))))
        print(f"{label}: {len(longest)}  " + " -> ".join(m.rsplit(".", 1)[-1] for m in longest))
    widths: list[tuple[int, str]] = []
    for name, path in sorted(modules().items()):
        if not name.startswith("dflashd.supervisor") or ".client" in name:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef):
                continue
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                    count = len(item.args.args) - 1 + len(item.args.kwonlyargs)
                    widths.append((count, f"{node.name} ({name.rsplit('.', 1)[-1]})"))
    for count, what in sorted(widths, reverse=True)[:4]:
        print(f"constructor: {what}: {count}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
