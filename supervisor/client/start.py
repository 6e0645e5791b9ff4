"""``dflashd start`` and ``dflashd restart``: the daemon in the foreground, or detached and checked.

Detached, ``start`` launches the daemon, waits for the first launch (the ready pipe), then
for the job's first step, its death, or ``start_wait_s``.  A job that dies within
``start_wait_s`` (an ImportError, a typo in the command) is reported there and then, with
its verdict and stderr tail, and ``start`` exits non-zero.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import sys
import time
from contextlib import closing
from pathlib import Path
from typing import Any, Final, NoReturn

import click
import orjson

from dflashd.supervisor.client.cmdhint import command_hint
from dflashd.supervisor.client.common import catch_ctrl_c, exposed_secret, fail
from dflashd.supervisor.client.firststep import wait_for_first_step
from dflashd.supervisor.client.render import use_color
from dflashd.supervisor.host.config import Config, ConfigError, load_config
from dflashd.supervisor.host.handover import (
    TERMINAL_STOPS,
    Handover,
    become_daemon,
    report_ready,
    spawn_daemon,
)
from dflashd.supervisor.host.home import (
    Home,
    HomeError,
    already_running_message,
    lock_is_held,
    unusable_path,
)
from dflashd.supervisor.model.exitcodes import (
    EXIT_ALREADY_RUNNING,
    EXIT_FATAL,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
)

_READY_TIMEOUT_S: Final = 120.0


def prepare(home: Home, config_path: Path | None, command: tuple[str, ...]) -> Config:
    """Config, cwd and home checked before anything starts (exit 2 with one line otherwise)."""
    for index, arg in enumerate(command, 1):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            shown = arg.encode("utf-8", "surrogateescape")
            fail(
                f"command argument {index} is not UTF-8 text ({shown!r}): dflashd keeps the "
                "command in UTF-8 records; rename the file or start it from a wrapper script",
                EXIT_USAGE,
            )
    try:
        config = load_config(config_path, command)
    except ConfigError as exc:
        fail(f"config error: {exc}", EXIT_USAGE)
    if (warning := exposed_secret(config_path, config)) is not None:
        click.echo(f"dflashd: {warning}", err=True)
    cwd = Path(config.cwd).expanduser()
    if not cwd.is_absolute() and os.environ.get("INVOCATION_ID") and Path.cwd() == Path("/"):
        # a unit runs in / (read-only under ProtectSystem=strict): "." there is never meant
        fail(
            f"config error: cwd: {config.cwd!r} is relative and this daemon runs under systemd"
            " in /; write an absolute path (or set the unit's WorkingDirectory=)",
            EXIT_USAGE,
        )
    if not cwd.is_dir():
        fail(f"config error: cwd: not a directory: {cwd}", EXIT_USAGE)
    # absolute from here on: the spawn record, status and a later restart name the real place
    config = dataclasses.replace(config, cwd=str(cwd.resolve()))
    if (hint := command_hint(config.command, cwd, config.env)) is not None:
        fail(hint, EXIT_USAGE)  # nothing launched, nothing recorded, no page
    if (why := unusable_path(home.root)) is not None:
        fail(why, EXIT_USAGE)  # before the home is made: a refused start leaves nothing behind
    try:
        home.create()
    except HomeError as exc:
        fail(str(exc), EXIT_USAGE)
    return config


def run_foreground(
    home: Home,
    config: Config,
    ready_fd: int | None,
    *,
    echo: bool = True,
    raw: bool = False,
    saved: tuple[Path | None, tuple[str, ...]] | None = None,
    warning: str | None = None,
) -> NoReturn:
    """Become the daemon program (``execv``: this process, its pid, its terminal and its
    signals go on as the daemon; :mod:`dflashd.supervisor.host.handover`), which takes the
    home.  ``saved``: the config path and command ``dflashd restart`` repeats, recorded only
    once the daemon holds the home's lock (a refused start records nothing); ``warning`` is
    said then too (a refused start says only why)."""
    out = sys.stdout
    echo = echo and ready_fd is None and out is not None
    # a bar's \r is kept into a terminal and a pipe (``| tee train.log``: ``cat`` redraws it in
    # place); the journal gets lines
    redraw = echo and (out.isatty() or not os.environ.get("JOURNAL_STREAM"))
    color = echo and use_color(out)
    handover = Handover(home, config, ready_fd, echo, raw, color, redraw, saved, warning)
    try:
        become_daemon(handover)
    except OSError as exc:
        message = f"cannot start the daemon program ({sys.executable}): {exc.strerror}"
        report_ready(ready_fd, {"ok": False, "error": message, "code": EXIT_USAGE})
        fail(message, EXIT_USAGE)


def print_launch(info: dict[str, Any]) -> None:
    """``run 3 launched (pid 1234)`` and the log's path, or what went wrong, as the detached
    daemon reported its launch (the foreground daemon says its own: ``foreground.py``).
    Never raises: the job runs whatever became of this terminal."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        _print_launch(info)


def _print_launch(info: dict[str, Any]) -> None:
    if info.get("ok"):
        click.echo(
            f"dflashd: run {info['run']} launched (pid {info['pid']}); daemon pid {info['daemon_pid']}"
        )
        click.echo(f"log: {info['log']}   (dflashd tail -f)")
    else:
        click.echo(f"dflashd: run {info.get('run')}: {info.get('error')}", err=True)
        if info.get("log"):
            click.echo(f"log: {info.get('log')}", err=True)


def start_detached(
    home: Home,
    config: Config,
    config_path: Path | None,
    command: tuple[str, ...],
    *,
    wait: bool = True,
    warning: str | None = None,
    env: dict[str, str] | None = None,
) -> int:
    """Launch the daemon in its own session; report the launch, then wait (``wait``) for the
    job's first step, its death or ``start_wait_s``.  ``warning`` is said once the daemon
    holds the home and launched (a refused start says only why).  ``env``: the daemon's and
    so the job's environment (``restart`` replays the last start's); None: this process's.

    Ctrl-C, at any moment and however often, ends this command with one line and exit 130
    (:func:`start_interrupted`): the job keeps running in the daemon's own session, or
    nothing was started when it came before the launch.
    """
    catch_ctrl_c(start_interrupted)
    return _launch(home, config, config_path, command, wait, _LAUNCHED, warning, env)


# What a Ctrl-C of ``start`` reports: a daemon spawned yet, and its run once launched.
_LAUNCHED: dict[str, Any] = {"spawned": False, "run": None}


def start_interrupted(signum: int, frame: object) -> None:
    """SIGINT while ``start`` works or waits: one line, exit 130, at once.  The handler says
    it and exits itself (no exception that code in between could swallow); the spawn is
    never cut half-way (SIGINT is held back across it), and later Ctrl-C are ignored."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if _LAUNCHED["run"]:
        message = f"stopped waiting; run {_LAUNCHED['run']} keeps running (dflashd stop to end it)"
    elif _LAUNCHED["spawned"]:
        message = "stopped waiting; the daemon goes on starting the job (dflashd status)"
    else:
        message = "interrupted before the daemon was started: nothing runs"
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    os.write(2, f"\ndflashd: {message}\n".encode())
    os._exit(EXIT_INTERRUPTED)


def _launch(
    home: Home,
    config: Config,
    config_path: Path | None,
    command: tuple[str, ...],
    wait: bool,
    launched: dict[str, Any],
    warning: str | None,
    env: dict[str, str] | None,
) -> int:
    if lock_is_held(home.lock):
        fail(already_running_message(home), 1)
    from dflashd.logs import last_records

    try:
        last = last_records(home.logs, 1)
    except OSError:  # unreadable now: the wait below filters by the new run's number anyway
        last = []
    after_seq = last[0].seq if last else 0  # follow only what this start writes
    read_fd, write_fd = os.pipe()
    # the daemon records the invocation once it holds the lock (a refused start never)
    saved = (config_path.absolute() if config_path else None, command)
    handover = Handover(home, config, write_fd, saved=saved)
    try:
        log_fd = os.open(
            home.daemon_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600
        )
    except OSError as exc:
        fail(f"cannot open {home.daemon_log}: {exc.strerror}", EXIT_USAGE)
    # Ctrl-C held back across the spawn: afterwards it is known whether a daemon was started
    signal.pthread_sigmask(signal.SIG_BLOCK, set(TERMINAL_STOPS))
    # the detached daemon's SIGINT and SIGQUIT are stops, even where this command ignores them
    ignoring = [s for s in TERMINAL_STOPS if signal.getsignal(s) is signal.SIG_IGN]
    try:
        for signum in ignoring:  # held back: none can come now
            signal.signal(signum, signal.SIG_DFL)
        with closing(os.fdopen(log_fd, "ab")) as daemon_log:
            spawn_daemon(handover, log_fd=daemon_log.fileno(), env=env)
        launched["spawned"] = True
    except OSError as exc:
        fail(f"cannot start the daemon program ({sys.executable}): {exc.strerror}", EXIT_USAGE)
    finally:
        for signum in ignoring:  # ignored again, which drops a press held back meanwhile
            signal.signal(signum, signal.SIG_IGN)
        os.close(write_fd)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, set(TERMINAL_STOPS))
    return _after_launch(home, config, read_fd, after_seq, wait, launched, warning)


def _after_launch(
    home: Home,
    config: Config,
    read_fd: int,
    after_seq: int,
    wait: bool,
    launched: dict[str, Any],
    warning: str | None = None,
) -> int:
    """The daemon's launch report, then (``wait``) its first step; ``launched`` gets the run."""
    info = _read_ready(read_fd)
    if info is None:
        fail(f"the daemon exited before launching anything; see {home.daemon_log}", 1)
    if not info.get("ok"):
        error = str(info.get("error"))
        if info.get("code") in (EXIT_USAGE, EXIT_ALREADY_RUNNING) or not info.get("run"):
            fail(error, int(info.get("code") or 1))
        _warn(warning)
        print_launch(info)
        return EXIT_FATAL
    launched["run"] = info["run"]
    _warn(warning)
    print_launch(info)
    if not wait:
        return 0
    return wait_for_first_step(home, int(info["run"]), config.start_wait_s, after_seq)


def _warn(warning: str | None) -> None:
    if warning is not None:
        click.echo(f"dflashd: {warning}", err=True)


def _read_ready(fd: int) -> dict[str, Any] | None:
    data = b""
    deadline = time.monotonic() + _READY_TIMEOUT_S
    with os.fdopen(fd, "rb") as reader:
        while time.monotonic() < deadline and b"\n" not in data:
            chunk = reader.read1(65536)
            if not chunk:
                break
            data += chunk
    try:
        info = orjson.loads(data.split(b"\n", 1)[0]) if data else None
    except orjson.JSONDecodeError:
        return None
    return info if isinstance(info, dict) else None
