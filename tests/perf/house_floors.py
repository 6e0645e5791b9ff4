"""The house seen from its imports (issue 35): the floors (the longest chain of dflashd modules,
each importing the next), for the whole package and for the daemon's side, and the
four widest constructors of the daemon (parameters besides ``self``).

    python tests/perf/house_floors.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.test_house import constructor_widths, graph, longest_chain


def main() -> int:
    edges = graph()
    supervisor = [m for m in edges if m.startswith("dflashd.supervisor")]
    daemon_side = [m for m in supervisor if ".client" not in m and not m.endswith("__main__")]
    for label, pool in (("floors", supervisor), ("daemon side", daemon_side)):
        longest = max((longest_chain(edges, m) for m in pool), key=len)
        print(f"{label}: {len(longest)}  " + " -> ".join(m.rsplit(".", 1)[-1] for m in longest))
    for count, what in sorted(constructor_widths(), reverse=True)[:4]:
        print(f"constructor: {what.rsplit('.', 1)[-1]} ({what.rsplit('.', 2)[-2]}): {count}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
