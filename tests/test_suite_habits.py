"""The suite's own habits, read from its source (issue 52): no ``time.sleep`` as synchronisation.

A sleep in a test (not in a job's code, which is a string or a file under ``tests/children``,
where a pause is the job's own pace) is allowed in two shapes only:

- a short step of a poll that a deadline or a count bounds: inside a ``for`` loop, or a
  ``while`` loop whose condition or body reads a clock or a deadline, so the test ends on
  what it waits for and fails at the bound, never on how long the machine took;
- a pause with its reason on its line (``# ...``): the subject under test is time itself (a
  span that must pass without a record, a user's finger, a pace for status calls).

A bare sleep outside a loop, or in a loop that nothing bounds, is the habit this rules out.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
_BOUNDS = ("monotonic", "deadline", "time.time", "perf_counter", "until", "remaining")


def _is_sleep(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "sleep"
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "time"
    )


def _bounded(loop: ast.For | ast.While, source: str) -> bool:
    if isinstance(loop, ast.For):
        return True
    text = ast.get_source_segment(source, loop) or ""
    return any(word in text for word in _BOUNDS)


def unjustified_sleeps(source: str) -> list[int]:
    """Lines of ``time.sleep`` calls that are neither a bounded poll's step nor explained."""
    tree = ast.parse(source)
    lines = source.splitlines()
    parents: dict[ast.AST, ast.AST] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[child] = node
    found = []
    for node in ast.walk(tree):
        if not _is_sleep(node):
            continue
        assert isinstance(node, ast.Call)
        if "#" in lines[node.lineno - 1]:
            continue
        holder = parents.get(node)
        while holder is not None and not isinstance(
            holder, ast.For | ast.While | ast.FunctionDef | ast.AsyncFunctionDef
        ):
            holder = parents.get(holder)
        if isinstance(holder, ast.For | ast.While) and _bounded(holder, source):
            continue
        found.append(node.lineno)
    return found


def test_no_test_sleeps_as_synchronisation() -> None:
    offenders = []
    for path in sorted(TESTS.rglob("*.py")):
        if "children" in path.relative_to(TESTS).parts:
            continue  # the jobs' own code: their pace is what they do
        for line in unjustified_sleeps(path.read_text()):
            offenders.append(f"{path.relative_to(TESTS)}:{line}")
    assert not offenders, "time.sleep neither a bounded poll's step nor explained: " + ", ".join(
        offenders
    )


def test_the_sleep_finder_tells_the_shapes_apart() -> None:
    bare = "import time\ndef t():\n    start()\n    time.sleep(2)\n    check()\n"
    unbounded = "import time\ndef t():\n    while not ready():\n        time.sleep(0.1)\n"
    polled = (
        "import time\ndef t():\n    deadline = time.monotonic() + 5\n"
        "    while not ready():\n        assert time.monotonic() < deadline\n"
        "        time.sleep(0.1)\n"
    )
    counted = "import time\ndef t():\n    for _ in range(50):\n        time.sleep(0.1)\n"
    explained = "import time\ndef t():\n    time.sleep(5)  # a span that must pass in silence\n"
    in_a_job = "JOB = 'import time; time.sleep(60)'\n"
    assert unjustified_sleeps(bare) == [4]
    assert unjustified_sleeps(unbounded) == [4]
    assert unjustified_sleeps(polled) == []
    assert unjustified_sleeps(counted) == []
    assert unjustified_sleeps(explained) == []
    assert unjustified_sleeps(in_a_job) == []
