"""What every ``dflashd`` command shares: the home option, failing with one line, run selection."""

from __future__ import annotations

import re
import signal
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final, NoReturn

import click

from dflashd.supervisor.host.config import Config
from dflashd.supervisor.host.home import Home, default_home, untrusted_home
from dflashd.supervisor.model.exitcodes import EXIT_USAGE

home_option = click.option(
    "--home",
    type=click.Path(file_okay=False, readable=False, path_type=Path),  # refusals are ours
    default=None,
    help="State directory [env DFLASHD_HOME; default $XDG_STATE_HOME/dflashd, in a Slurm "
    "job dflashd-slurm-JOB-nodeN]; "
    "accepted before or after the command.",
)


def catch_ctrl_c(handler: Callable[[int, Any], Any]) -> None:
    """What a Ctrl-C does from here on, unless the command was started with SIGINT ignored (a
    script's background job): then it stays ignored, as a shell expects of every program."""
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, handler)


def config_option(help_text: str) -> Callable[[Any], Any]:
    """``-c/--config FILE`` (a TOML file; a directory is refused)."""
    return click.option(
        "-c",
        "--config",
        "config_path",
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        help=help_text,
    )


def timeout_option(help_text: str) -> Callable[[Any], Any]:
    """``-t/--timeout S``: finite seconds, at most the config's bound on durations."""
    from dflashd.supervisor.model.bounds import MAX_SECONDS

    return click.option(
        "-t",
        "--timeout",
        "timeout_s",
        type=click.FloatRange(min=0, max=MAX_SECONDS),
        default=None,
        help=help_text,
    )


def resolve_home(path: Path | None) -> Home:
    """The command's ``--home``, else the group's, else the default."""
    if path is None:
        ctx = click.get_current_context(silent=True)
        while ctx is not None and path is None:
            obj = ctx.obj if isinstance(ctx.obj, dict) else {}
            path = obj.get("home")
            ctx = ctx.parent
    where = Home((path or default_home()).expanduser().absolute())
    problem = untrusted_home(where.root)
    if problem is not None:
        fail(problem, EXIT_USAGE)
    return where


def fail(message: str, code: int) -> NoReturn:
    """One line on stderr, then exit ``code``: a path or a command in it that holds a newline
    or an escape sequence is shown escaped (one line, nothing that reprograms a terminal)."""
    from dflashd.supervisor.speak.echo import escape_controls

    click.echo(f"dflashd: {escape_controls(message)}", err=True)
    sys.exit(code)


_DURATION: Final = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNIT_S: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# journalctl's forms: "10 min ago", "2 hours ago", "today", "yesterday", "04:40", "04:40:10"
_AGO: Final = re.compile(
    r"^(\d+(?:\.\d+)?)\s*(s|sec|secs|second|seconds|m|min|mins|minute|minutes|h|hr|hrs|hour|hours"
    r"|d|day|days)\s+ago$"
)
_CLOCK: Final = re.compile(r"^(\d{1,2}):(\d{2})(?::(\d{2}))?$")


def _journal_time(text: str, now: float) -> float | None:
    """journalctl's relative and clock forms, as local time; None when ``text`` is none."""
    lowered = text.strip().lower()
    if (ago := _AGO.match(lowered)) is not None:
        return now - float(ago.group(1)) * _UNIT_S[ago.group(2)[0]]
    midnight = datetime.fromtimestamp(now).replace(hour=0, minute=0, second=0, microsecond=0)
    if lowered in ("today", "yesterday", "now"):
        if lowered == "now":
            return now
        return (midnight - timedelta(days=1 if lowered == "yesterday" else 0)).timestamp()
    if (clock := _CLOCK.match(lowered)) is not None:
        hour, minute, second = int(clock.group(1)), int(clock.group(2)), int(clock.group(3) or 0)
        if hour < 24 and minute < 60 and second < 60:
            return midnight.replace(hour=hour, minute=minute, second=second).timestamp()
    return None


def parse_since(text: str, now: float | None = None) -> str:
    """``10m``, ``2h``, ``1d`` ago, or an ISO 8601 time -> the RFC 3339 UTC stamp records carry."""
    now = time.time() if now is None else now
    match = _DURATION.match(text.strip())
    journal = None if match else _journal_time(text, now)
    if match:
        epoch = now - float(match.group(1)) * _UNIT_S[match.group(2)]
    elif journal is not None:
        epoch = journal
    else:
        try:
            parsed = datetime.fromisoformat(text.strip())
        except ValueError:
            raise click.BadParameter(
                "expected a duration (30s, 10m, 2h, 1d), journalctl's forms ('10 min ago', "
                "today, yesterday, 04:40) or an ISO time (2026-11-30T18:00)",
                param_hint="--since",
            ) from None
        if parsed.tzinfo is None:
            parsed = parsed.astimezone()  # a local time, as a person types it
        epoch = parsed.timestamp()
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def known_runs(home: Home) -> list[int]:
    """The run numbers this home has a record of (runs.sqlite, read-only)."""
    from dflashd.supervisor.speak.history import recorded_runs

    return recorded_runs(home.runs_db)


def resolve_run(home: Home, which: str | None, *, must_exist: bool = True) -> int | None:
    """``--run``: a number, ``current`` or ``previous``; exit 2 naming the runs there are."""
    if which is None:
        return None
    from dflashd.supervisor.speak.statusview import read_state

    if which.isdigit():
        run_no = int(which)
    elif which in ("current", "previous"):
        state = read_state(home.state_file) or {}
        current = state.get("run")
        if not isinstance(current, int):
            runs = known_runs(home)
            current = runs[-1] if runs else 0
        run_no = current if which == "current" else max(0, current - 1)
        if which == "previous" and run_no < 1:
            fail(f"no previous run in {home.root}: run {current} is the only one", EXIT_USAGE)
    else:
        fail(f"--run: expected a run number, 'current' or 'previous', got {which!r}", EXIT_USAGE)
    runs = known_runs(home)
    if must_exist and runs and run_no not in runs:
        shown = _ranges(runs)
        fail(f"no run {run_no} in {home.root}; runs there: {shown}", EXIT_USAGE)
    return run_no


def _ranges(runs: list[int]) -> str:
    """``1-4, 7, 9-12``."""
    parts: list[str] = []
    start = prev = runs[0]
    for run_no in [*runs[1:], None]:
        if run_no is not None and run_no == prev + 1:
            prev = run_no
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if run_no is not None:
            start = prev = run_no
    return ", ".join(parts)


def exposed_secret(path: Path | None, config: Config) -> str | None:
    """A warning when the config holds a secret (``alerts.webhook_url``) and others may read
    the file; None when it does not, or the file is private."""
    if path is None or not config.alerts.webhook_url:
        return None
    try:
        mode = path.stat().st_mode
    except OSError:
        return None
    if not mode & 0o004:
        return None
    return (
        f"warning: {path} holds alerts.webhook_url (a secret) and is readable by every user "
        f"(mode {mode & 0o777:04o}): chmod o-r {path}"
        + (" (0640 root:dflashd for the service)" if str(path).startswith("/etc/") else "")
    )
