"""A pytest plugin that counts the suite's tests by kind: those that start a real process (a
child, a daemon, a CLI, a tool) and those that start none (histories through ``step``, pure
rules, parsers, files).  Issue 52 asks that most behaviour be tested as histories.

    python -m pytest -p tests.perf.kinds -q            # the counts at the end, per file too

A test counts as a real-process test when, during its setup or call, anything in the test's process
forks or spawns (``subprocess``, ``os.fork``, ``os.posix_spawn``); what those processes start
themselves is theirs.
"""

from __future__ import annotations

import os
import subprocess
from collections import Counter
from collections.abc import Callable, Generator
from typing import Any

import pytest

_started = [0]


def _counting(original: Callable[..., Any]) -> Callable[..., Any]:
    def started(*args: Any, **kwargs: Any) -> Any:
        _started[0] += 1
        return original(*args, **kwargs)

    return started


def pytest_configure(config: pytest.Config) -> None:
    subprocess.Popen._execute_child = _counting(subprocess.Popen._execute_child)  # type: ignore[attr-defined]
    for name in ("fork", "posix_spawn", "posix_spawnp"):
        if hasattr(os, name):
            setattr(os, name, _counting(getattr(os, name)))
    config.stash[_KINDS] = Counter()


_KINDS = pytest.StashKey[Counter[tuple[str, str]]]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None]:
    _started[0] = 0  # the test's fixtures count as its own
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None]:
    outcome = yield
    if call.when == "call":
        report = outcome.get_result()
        report.user_properties.append(("kind", "process" if _started[0] else "pure"))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when != "call" or not report.passed:
        return
    kind = dict(report.user_properties).get("kind")
    if kind is not None:
        config = _CONFIG[0]
        if config is not None:
            config.stash[_KINDS][(report.nodeid.split("::", 1)[0], str(kind))] += 1


_CONFIG: list[pytest.Config | None] = [None]


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    _CONFIG[0] = session.config


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    kinds = config.stash[_KINDS]
    pure = sum(n for (_, kind), n in kinds.items() if kind == "pure")
    process = sum(n for (_, kind), n in kinds.items() if kind == "process")
    if not pure + process:
        return
    write = terminalreporter.write_line
    write(
        f"tests by kind: {pure} start no process, {process} start one "
        f"({100 * pure / (pure + process):.0f} % without)"
    )
    files = sorted({path for path, _ in kinds})
    for path in files:
        write(f"  {path}: {kinds[(path, 'pure')]} pure, {kinds[(path, 'process')]} process")
