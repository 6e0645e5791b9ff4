"""Ctrl-C and Ctrl-\\ of dflashd: ``start``'s Ctrl-C is one line and exit 130 at any moment
from a terminal; a daemon stops cleanly on either; and a command begun with them ignored keeps
them ignored.

A terminal's foreground job starts with SIGINT and SIGQUIT at their defaults; a script's
background job (``dflashd start … &``) with both ignored, and a program is expected to keep them
so.  A suite run in the background (``setsid bash -c … &``, as the busy-loop runs were; CI's
``timeout`` wrapper hands its child the defaults) ignored both, and every process it started
inherited that: its starts set their handler only once their modules loaded, and on a loaded
machine both of a test's quick Ctrl-C fell before that and were lost (the start then waited
for a first step that never came).  The suite now gives every process a terminal's signals
(conftest's ``pytest_configure``); the ignore is set here, for the starts that test it.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest

from dflashd.logs import EventRecord, follow, read_records
from dflashd.supervisor.host.home import lock_is_held
from tests.conftest import child, daemon_argv, dflashd_argv, run_cli, write_config

# A traceback that names no file of dflashd: the Ctrl-C fell in the interpreter's own start-up
# (its site, runpy), before any of dflashd ran; nothing a program can catch there.
_DFLASHDS_OWN = re.compile(r'File "[^"]*/dflashd/(supervisor|logs)/')


def _interpreters_own_start_up(returncode: int, err: str) -> bool:
    """The Ctrl-C came before any of dflashd ran: killed by it before Python set its handler
    (a silent death, as from a terminal), or Python's own traceback from its start-up."""
    if returncode == -signal.SIGINT and not err:
        return True
    if "Could not import runpy module" in err:
        return True
    return "KeyboardInterrupt" in err and not _DFLASHDS_OWN.search(err)


_HANDLER_AT_IMPORT = """
import signal, sys
if sys.argv[1] == "ignored":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
sys.argv[:] = sys.argv[2:]  # as sys.argv is while ``python -m`` finds its module
import dflashd.supervisor
handler = signal.getsignal(signal.SIGINT)
print(getattr(handler, "__name__", None) or handler.name)
"""


@pytest.mark.parametrize(
    ("started", "argv", "handler"),
    [
        ("plain", ["-m"], "interrupted_while_loading"),  # python -m dflashd.supervisor …
        ("ignored", ["-m"], "SIG_IGN"),  # a script's background job: kept ignored
        ("plain", ["-m", "--handover-fd"], "default_int_handler"),  # the daemon sets its own
        ("plain", ["/usr/local/bin/dflashd", "start"], "interrupted_while_loading"),  # script
        ("plain", ["/site/dflashd/__main__.py"], "interrupted_while_loading"),  # python -m dflashd
        ("plain", ["/usr/lib/python3/pytest"], "default_int_handler"),  # a plain import
    ],
)
def test_the_commands_ctrl_c_is_held_from_the_packages_first_line(
    started: str, argv: list[str], handler: str
) -> None:
    """Under ``python -m``, the package's ``__init__`` (the first of dflashd that runs) sets
    the command's handler: a Ctrl-C while runpy loads the package and ``__main__`` is one line
    and 130, not runpy's traceback (seen once in CI, at 50 ms).  Deterministic: the handler
    each way of being loaded leaves, read right after the import."""
    done = subprocess.run(
        [sys.executable, "-c", _HANDLER_AT_IMPORT, started, *argv],
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == handler


@pytest.fixture
def interrupted_starts(tmp_path: Path, home: Path) -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    run_cli("stop", "--home", str(home))


@pytest.mark.parametrize("after_s", [0.05, 0.15, 0.4, 0.8, 1.5, "launched"])
def test_two_quick_ctrl_c_end_start_with_one_line_and_130(
    tmp_path: Path,
    home: Path,
    after_s: float | str,
    interrupted_starts: list[subprocess.Popen[str]],
) -> None:
    config = write_config(tmp_path / "c.toml", {"gpus": "none", "start_wait_s": 120})
    argv = dflashd_argv("start", "--home", str(home), "--config", str(config), "--")
    argv += child("prints_then_waits.py")
    for _attempt in range(5):
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        interrupted_starts.append(proc)
        if after_s == "launched":
            assert proc.stdout is not None
            assert "launched" in proc.stdout.readline()
        else:
            assert isinstance(after_s, float)
            time.sleep(after_s)  # the moment under test: a user's finger, not an event
        proc.send_signal(signal.SIGINT)
        time.sleep(0.02)  # the second press of a user's two quick ones
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        if not _interpreters_own_start_up(proc.returncode, err):
            break
    else:
        pytest.skip("each Ctrl-C landed in the interpreter's start-up, before dflashd ran")
    assert proc.returncode == 130, (out, err)
    said = [line for line in err.splitlines() if line.strip()]
    assert len(said) == 1 and said[0].startswith("dflashd: "), err
    assert "Traceback" not in err and "Aborted" not in err
    if "nothing" in said[0]:  # interrupted before the launch: no daemon holds the home
        assert not lock_is_held(home / "dflashd.lock")
    if "goes on" in said[0]:  # the daemon carries on: its launch first, so the stop ends it
        deadline = time.monotonic() + 30
        records = follow(
            home / "logs", poll_s=0.02, should_stop=lambda: time.monotonic() > deadline
        )
        with closing(records):
            launched = any(getattr(r, "event", None) == "launched" for r in records)
        assert launched


def _ignore_ctrl_c() -> None:
    """As a script's background job begins: a terminal's Ctrl-C and Ctrl-\\ ignored."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGQUIT, signal.SIG_IGN)


def _begun_ignoring_ctrl_c(argv: list[str], stdout: int = subprocess.PIPE) -> subprocess.Popen[str]:
    """``argv`` started as a script's background job is: Ctrl-C and Ctrl-\\ ignored."""
    return subprocess.Popen(
        argv,
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_ignore_ctrl_c,  # noqa: PLW1509 (two sigactions between fork and exec)
    )


def test_a_start_begun_with_ctrl_c_ignored_ignores_it_at_every_moment(
    tmp_path: Path, home: Path, interrupted_starts: list[subprocess.Popen[str]]
) -> None:
    """Ctrl-C from the first instant to the first step: none ends the command or says a word
    (before, those that came before its modules loaded were lost and the later ones ended
    it: which one did depended on the machine's load)."""
    go = tmp_path / "go"
    config = write_config(tmp_path / "c.toml", {"gpus": "none", "start_wait_s": 120})
    job = f"import os, threading\nwhile not os.path.exists({str(go)!r}):\n"
    job += "    threading.Event().wait(0.02)\nprint('step 1 loss 2.5', flush=True)\n"
    job += "threading.Event().wait()\n"
    argv = dflashd_argv("start", "--home", str(home), "--config", str(config), "--")
    argv += [sys.executable, "-c", job]
    proc = _begun_ignoring_ctrl_c(argv)
    interrupted_starts.append(proc)
    done = threading.Event()
    sent = [0]

    def press_ctrl_c_again_and_again() -> None:
        while not done.is_set() and proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            sent[0] += 1
            done.wait(0.005)

    presser = threading.Thread(target=press_ctrl_c_again_and_again, daemon=True)
    presser.start()
    try:
        assert proc.stdout is not None
        launched = proc.stdout.readline()  # every Ctrl-C until here: loading, spawn, launch
        assert "run 1 launched" in launched, launched
        pressed_before_launch = sent[0]
        go.touch()  # the first step, while the presses go on through the wait
        out, err = proc.communicate(timeout=60)
    finally:
        done.set()
        presser.join(10)
    assert pressed_before_launch >= 3, pressed_before_launch
    assert proc.returncode == 0, (out, err)
    assert "run 1 is training" in out, out
    assert "interrupted" not in err and "stopped waiting" not in err, err
    assert "Traceback" not in err, err


def _events_until(home: Path, event: str, timeout: float = 60) -> list[EventRecord]:
    """Follow the home's log until a supervisor record ``event``: the records so far."""
    deadline = time.monotonic() + timeout
    seen: list[EventRecord] = []
    records = follow(home / "logs", poll_s=0.02, should_stop=lambda: time.monotonic() > deadline)
    with closing(records):
        for record in records:
            if isinstance(record, EventRecord):
                seen.append(record)
                if record.event == event:
                    return seen
    raise AssertionError(f"no {event} within {timeout}s: {seen[-5:]}")


def test_the_detached_daemon_of_a_start_begun_ignoring_ctrl_c_still_stops_on_sigint(
    tmp_path: Path, home: Path, interrupted_starts: list[subprocess.Popen[str]]
) -> None:
    """The start keeps its inherited ignore; the daemon it leaves behind does not inherit it:
    ``kill -INT`` stops a detached daemon (its documented stop) whoever ran ``start``."""
    config = write_config(tmp_path / "c.toml", {"gpus": "none"})
    argv = dflashd_argv("start", "--no-wait", "--home", str(home), "--config", str(config))
    argv += ["--", *child("prints_then_waits.py")]
    proc = _begun_ignoring_ctrl_c(argv)
    interrupted_starts.append(proc)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "run 1 launched" in out, (out, err)
    _events_until(home, "launched")
    daemon_pid = int(json.loads(run_cli("status", "--json", "--home", str(home)).stdout)["pid"])
    os.kill(daemon_pid, signal.SIGINT)
    ended = _events_until(home, "daemon_exit")
    verdicts = [r.fields["verdict"] for r in ended if r.event == "exit"]
    assert verdicts == ["stopped"], ended[-5:]


def test_a_foreground_daemon_begun_ignoring_ctrl_c_is_not_stopped_by_it(
    tmp_path: Path, home: Path
) -> None:
    """``dflashd start --foreground … &`` in a script: a Ctrl-C or Ctrl-\\ for the script's
    foreground is noted and ignored, the job runs on, and SIGTERM (or ``dflashd stop``) still
    stops it."""
    config = write_config(tmp_path / "c.toml", {"gpus": "none"})
    proc = _begun_ignoring_ctrl_c(
        daemon_argv(home, config, child("prints_then_waits.py")), stdout=subprocess.DEVNULL
    )
    lines: queue.Queue[str] = queue.Queue()

    def read_stderr() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.put(line)

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    try:
        _events_until(home, "launched")
        for signum in (signal.SIGINT, signal.SIGQUIT):
            proc.send_signal(signum)
            said = ""
            while "signal_ignored" not in said:  # the loop has taken it
                said = lines.get(timeout=30)
            assert signal.Signals(signum).name in said, said
        status = json.loads(run_cli("status", "--json", "--home", str(home)).stdout)
        assert status["state"] == "running" and status["child_pid"], status
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(10)  # the pipe's end: the daemon and its job are gone
        assert proc.stderr is not None
        proc.stderr.close()
    exits = [r for r in read_records(home / "logs") if isinstance(r, EventRecord)]
    verdicts = [r.fields["verdict"] for r in exits if r.event == "exit"]
    assert verdicts == ["stopped"]


@pytest.mark.parametrize(
    "signum", [signal.SIGINT, signal.SIGQUIT], ids=["ctrl-c", "ctrl-backslash"]
)
def test_a_foreground_daemon_stops_cleanly_on_a_terminals_ctrl_c_or_ctrl_backslash(
    tmp_path: Path, home: Path, signum: int
) -> None:
    """Ctrl-\\ (SIGQUIT) at the terminal of ``start --foreground`` is a stop, as Ctrl-C is and
    as supervisord reads it: before, its default killed the daemon on the spot, with no exit
    record and no word in the log, and the job died with it."""
    config = write_config(tmp_path / "c.toml", {"gpus": "none"})
    proc = subprocess.Popen(
        daemon_argv(home, config, child("prints_then_waits.py")),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _events_until(home, "launched")
        proc.send_signal(signum)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    events = [r for r in read_records(home / "logs") if isinstance(r, EventRecord)]
    assert [r.fields["verdict"] for r in events if r.event == "exit"] == ["stopped"]
    assert events[-1].event == "daemon_exit", events[-1]
