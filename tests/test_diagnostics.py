"""dflashd's own log: captured in tests, rendered for the journal, JSON, console."""

from __future__ import annotations

import contextvars
import io
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from dflashd.supervisor.speak.diagnostics import capture_logs, configure_logging, get_logger
from tests.harness import Harness


class _Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self._tty = tty

    def isatty(self) -> bool:
        return self._tty


def _render(environ: dict[str, str], tty: bool) -> str:
    stream = _Stream(tty)

    def log_two() -> None:
        get_logger().error("exit", run=3, verdict="crashed")
        get_logger().info("launched", run=4, pid=99)

    configure_logging(stream=stream, environ=environ)
    try:  # an empty context: nothing an earlier test's daemon bound (run, pid) comes along
        contextvars.Context().run(log_two)
    finally:
        configure_logging()  # back to stderr
    return stream.getvalue()


def test_journal_lines_carry_sd_daemon_priorities() -> None:
    """Under systemd (JOURNAL_STREAM): <3> for an error, <6> for info, at the very start of a line."""
    lines = _render({"JOURNAL_STREAM": "8:1234"}, tty=False).splitlines()
    assert lines[0].startswith("<3>event='exit'") and "verdict='crashed'" in lines[0]
    assert lines[1].startswith("<6>event='launched'")


def test_daemon_log_is_one_json_object_per_line() -> None:
    """Not a terminal, not the journal (daemon.log): JSON with a UTC timestamp and the level."""
    first = json.loads(_render({}, tty=False).splitlines()[0])
    assert first["event"] == "exit" and first["level"] == "error" and first["run"] == 3
    assert first["timestamp"].endswith("Z")


def test_console_has_colours_only_without_no_color() -> None:
    """A terminal gets colours, unless NO_COLOR is set."""
    assert "\x1b[" in _render({}, tty=True)
    plain = _render({"NO_COLOR": "1"}, tty=True).splitlines()
    assert "\x1b[" not in "".join(plain)
    assert "[error    ] exit" in plain[0] and plain[0].endswith("run=3 verdict=crashed")
    assert plain[1].endswith("launched                 run=4 pid=99")


def test_context_is_bound_once_and_debug_is_filtered() -> None:
    """bind_run's fields go with every later event of the thread; below the level, nothing."""
    import contextvars

    from dflashd.supervisor.speak.diagnostics import bind_run

    def logged() -> str:
        stream = _Stream(False)
        configure_logging("info", stream=stream, environ={})
        try:
            bind_run(run=7, pid=70)
            get_logger().debug("not_shown")
            get_logger().warning("shown", extra=1)
        finally:
            configure_logging()
        return stream.getvalue()

    lines = contextvars.copy_context().run(logged).splitlines()
    assert len(lines) == 1
    record = json.loads(lines[0])
    assert (record["run"], record["pid"], record["extra"], record["level"]) == (7, 70, 1, "warning")


def test_one_call_writes_the_record_and_the_log_line(tmp_path: Path) -> None:
    """A run that ends: the exit record and an error-level log line come from the same call."""
    harness = Harness(tmp_path / "home", {"restart": {"early_retries": 0}})
    try:
        with capture_logs() as logs:
            harness.ops.die(harness.pid, sig=signal.SIGSEGV)
            harness.daemon.reap()
        exits: list[dict[str, Any]] = [e for e in logs if e["event"] == "exit"]
        assert exits and exits[0]["log_level"] == "error" and exits[0]["run"] == 1
        assert exits[0]["verdict"] == "silent_death" and "tail" not in exits[0]
        assert any(e["event"] == "fatal" for e in logs)
        assert harness.events("exit")[0].fields["verdict"] == "silent_death"
    finally:
        harness.close()


IDLE_IMPORTS = r"""
import io, json, sys
from dflashd.supervisor.host.home import Home
from dflashd.supervisor.speak.diagnostics import configure_logging, get_logger

home = Home(__import__("pathlib").Path(sys.argv[1]))
home.root.mkdir()
stream = io.StringIO()
configure_logging("info", stream=stream)
get_logger().info("started", run=1)
loaded = [m for m in ("ssl", "_ssl", "_hashlib", "hashlib", "rich") if m in sys.modules]
print(json.dumps({"loaded": loaded, "said": "started" in stream.getvalue(), "id": home.id}))
"""


def test_logging_and_the_home_load_no_openssl(tmp_path: Path) -> None:
    """Issue 53 (idle memory): structlog's asyncio would import ssl, and ``secrets`` hashlib;
    each loads OpenSSL (3.6 MiB resident, 35 -> 30 MiB idle). Neither is loaded by the daemon's
    logging or its home, and logging still works; ssl imports as usual afterwards."""
    done = subprocess.run(
        [sys.executable, "-c", IDLE_IMPORTS, str(tmp_path / "home")],
        capture_output=True,
        text=True,
        check=True,
    )
    found = json.loads(done.stdout)
    assert found["loaded"] == [] and found["said"] and len(found["id"]) == 32, found
    later = "import dflashd.supervisor.speak.diagnostics as d; d._import_structlog(); import ssl"
    subprocess.run([sys.executable, "-c", later], check=True)
