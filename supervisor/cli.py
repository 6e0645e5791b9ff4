"""The ``dflashd`` command line (DESIGN §8): start, status, tail, stop."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Final, NoReturn

import click
import orjson

from dflashd.supervisor import __version__
from dflashd.supervisor.config import ConfigError, load_config
from dflashd.supervisor.home import (
    AlreadyRunning,
    Home,
    HomeLock,
    default_home,
    lock_is_held,
    read_lock_pid,
)

EXIT_NOT_RUNNING: Final = 3
_READY_TIMEOUT_S: Final = 120.0

_home_option = click.option(
    "--home",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="State directory [env DFLASHD_HOME; default $XDG_STATE_HOME/dflashd].",
)


def _home(path: Path | None) -> Home:
    return Home((path or default_home()).expanduser().absolute())


def _fail(message: str, code: int) -> NoReturn:
    click.echo(f"dflashd: {message}", err=True)
    sys.exit(code)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="dflashd")
def main() -> None:
    """dflashd: a crash-resilient supervisor for long GPU training jobs.

    It logs before it launches, knows the moment the job dies and why, alerts, and
    restarts with backoff.  With no command, `dflashd start` runs the bundled
    DFlash drafter trainer.
    """


# -- start ------------------------------------------------------------------------------


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@_home_option
@click.option(
    "--foreground", is_flag=True, help="Stay attached (systemd uses this with Type=notify)."
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="TOML config (DESIGN §7); every key has a default.",
)
@click.option("--ready-fd", type=int, default=None, hidden=True)
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def start(
    home: Path | None,
    foreground: bool,
    config_path: Path | None,
    ready_fd: int | None,
    command: tuple[str, ...],
) -> None:
    """Start the daemon and launch the job: `dflashd start [--config F] [-- CMD ARG...]`.

    Returns once the child is launched and prints the run number and the log path.
    Exits 1 if a daemon already runs on this home, 2 for a bad config.
    """
    if command and command[0] == "--":
        command = command[1:]
    try:
        config = load_config(config_path, tuple(command))
    except ConfigError as exc:
        _fail(f"config error: {exc}", 2)
    cwd = Path(config.cwd).expanduser()
    if not cwd.is_dir():
        _fail(f"config error: cwd: not a directory: {cwd}", 2)
    where = _home(home)
    try:
        where.create()
    except OSError as exc:
        _fail(f"cannot create home {where.root}: {exc.strerror}", 2)
    if ready_fd is None and lock_is_held(where.lock):
        _fail(f"already running (pid {read_lock_pid(where.lock)}) on {where.root}", 1)
    if foreground:
        sys.exit(_run_foreground(where, config, ready_fd))
    sys.exit(_start_detached(where, config_path, command))


def _run_foreground(home: Home, config: Any, ready_fd: int | None) -> int:
    from dflashd.supervisor.daemon import Daemon
    from dflashd.supervisor.logging import configure_logging

    lock = HomeLock(home.lock)
    try:
        lock.acquire()
    except AlreadyRunning as exc:
        _report_ready(
            ready_fd, {"ok": False, "error": f"already running (pid {exc.pid}) on {home.root}"}
        )
        _fail(f"already running (pid {exc.pid}) on {home.root}", 1)
    configure_logging()
    from dflashd.logs.writer import LogWriterError

    def first_launch(info: dict[str, Any]) -> None:
        if ready_fd is not None:
            _report_ready(ready_fd, info)
        else:
            _print_launch(info)

    try:
        daemon = Daemon(home, config, on_first_launch=first_launch)
    except LogWriterError as exc:
        _report_ready(ready_fd, {"ok": False, "error": str(exc)})
        _fail(str(exc), 1)
    try:
        return daemon.serve()
    finally:
        lock.release()


def _report_ready(fd: int | None, info: dict[str, Any]) -> None:
    if fd is None:
        return
    try:
        os.write(fd, orjson.dumps(info) + b"\n")
        os.close(fd)
    except OSError:
        pass


def _print_launch(info: dict[str, Any]) -> None:
    if info.get("ok"):
        click.echo(
            f"dflashd: run {info['run']} launched (pid {info['pid']}); daemon pid {info['daemon_pid']}"
        )
        click.echo(f"log: {info['log']}   (dflashd tail -f)")
    else:
        click.echo(f"dflashd: run {info.get('run')}: {info.get('error')}", err=True)
        click.echo(f"log: {info.get('log')}", err=True)


def _start_detached(home: Home, config_path: Path | None, command: tuple[str, ...]) -> int:
    read_fd, write_fd = os.pipe()
    argv = [
        sys.executable,
        "-m",
        "dflashd.supervisor",
        "start",
        "--foreground",
        "--home",
        str(home.root),
    ]
    argv += ["--ready-fd", str(write_fd)]
    if config_path is not None:
        argv += ["--config", str(config_path.absolute())]
    if command:
        argv += ["--", *command]
    with open(home.daemon_log, "ab") as daemon_log:
        subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=daemon_log,
            stderr=daemon_log,
            pass_fds=(write_fd,),
            start_new_session=True,
        )
    os.close(write_fd)
    data = b""
    deadline = time.monotonic() + _READY_TIMEOUT_S
    with os.fdopen(read_fd, "rb") as reader:
        while time.monotonic() < deadline:
            chunk = reader.read1(65536)
            if not chunk:
                break
            data += chunk
            if b"\n" in data:
                break
    if not data:
        _fail(f"the daemon exited before launching anything; see {home.daemon_log}", 1)
    info = orjson.loads(data.split(b"\n", 1)[0])
    if not info.get("ok"):
        error = str(info.get("error"))
        if error.startswith("already running"):
            _fail(error, 1)
        _print_launch(info)
        return 1
    _print_launch(info)
    return 0


# -- status -----------------------------------------------------------------------------


@main.command()
@_home_option
@click.option("--json", "as_json", is_flag=True, help="One JSON object (DESIGN §8).")
def status(home: Path | None, as_json: bool) -> None:
    """Show the daemon's state, the current run, the last exit and the GPUs.

    Exit 0 while the daemon runs, 3 when it does not (the last known state is still shown).
    """
    from dflashd.supervisor.control import ControlError, request
    from dflashd.supervisor.render import Painter, format_status, use_color
    from dflashd.supervisor.statefile import read_state

    where = _home(home)
    running = lock_is_held(where.lock)
    state: dict[str, Any] | None = None
    if running:
        try:
            state = request(where.control_socket, {"cmd": "status"})
        except ControlError:
            state = None
    if state is None:
        running = False
        state = read_state(where.state_file)
    if state is None:
        if as_json:
            click.echo(
                orjson.dumps(
                    {"state": "stopped", "running": False, "home": str(where.root)}
                ).decode()
            )
        else:
            click.echo(f"dflashd is not running (nothing recorded in {where.root})")
        sys.exit(EXIT_NOT_RUNNING)
    state.pop("config", None)
    state["running"] = running
    if not running and state.get("state") in ("running", "starting", "backoff", "stopping"):
        state["state_note"] = "the daemon is gone without recording an end; this is its last state"
    if as_json:
        click.echo(orjson.dumps(state).decode())
    else:
        click.echo(format_status(state, running=running, paint=Painter(use_color(sys.stdout))))
    sys.exit(0 if running else EXIT_NOT_RUNNING)


# -- tail -------------------------------------------------------------------------------


def _resolve_run(home: Home, which: str | None) -> int | None:
    if which is None:
        return None
    if which.isdigit():
        return int(which)
    from dflashd.logs.reader import last_records
    from dflashd.supervisor.statefile import read_state

    state = read_state(home.state_file) or {}
    current = state.get("run")
    if not isinstance(current, int):
        last = last_records(home.logs, 1)
        current = last[0].run if last else 0
    if which == "current":
        return current
    if which == "previous":
        return max(0, current - 1)
    raise click.BadParameter("expected a run number, 'current' or 'previous'", param_hint="--run")


@main.command()
@_home_option
@click.option(
    "-n",
    "lines",
    type=click.IntRange(min=0),
    default=20,
    show_default=True,
    help="Records to show.",
)
@click.option("-f", "--follow", is_flag=True, help="Keep printing new records, across rotations.")
@click.option("--run", "which_run", default=None, help="A run number, 'current' or 'previous'.")
@click.option(
    "--src",
    type=click.Choice(["stdout", "stderr", "dflashd"]),
    default=None,
    help="Only this source.",
)
@click.option("--json", "as_json", is_flag=True, help="Raw JSON-lines records.")
def tail(
    home: Path | None,
    lines: int,
    follow: bool,
    which_run: str | None,
    src: str | None,
    as_json: bool,
) -> None:
    """Show the run log: child output and dflashd's own records, across rotated files."""
    from dflashd.logs.reader import RecordFilter, last_records
    from dflashd.logs.reader import follow as follow_records
    from dflashd.logs.records import encode
    from dflashd.supervisor.render import Painter, format_record, use_color

    where = _home(home)
    if not where.logs.is_dir():
        _fail(
            f"no logs in {where.root} (has dflashd been started with this home?)", EXIT_NOT_RUNNING
        )
    keep = RecordFilter(run=_resolve_run(where, which_run), src=src)
    paint = Painter(use_color(sys.stdout))

    def show(record: Any) -> None:
        if as_json:
            sys.stdout.write(encode(record).decode())
        else:
            sys.stdout.write(format_record(record, paint) + "\n")

    records = last_records(where.logs, lines, keep)
    for record in records:
        show(record)
    sys.stdout.flush()
    if not follow:
        return
    after = records[-1].seq if records else _last_seq(where)
    try:
        for record in follow_records(where.logs, keep, after_seq=after, poll_s=0.1):
            show(record)
            sys.stdout.flush()
    except (KeyboardInterrupt, BrokenPipeError):
        pass


def _last_seq(home: Home) -> int:
    from dflashd.logs.reader import last_records

    last = last_records(home.logs, 1)
    return last[0].seq if last else 0


# -- report -----------------------------------------------------------------------------


@main.command()
@_home_option
@click.option(
    "--run", "which_run", default=None, help="Only this run: a number, 'current' or 'previous'."
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("dflashd-report.html"),
    show_default=True,
    help="Where to write the report: .html (a self-contained page) or .svg (the charts alone).",
)
def report(home: Path | None, which_run: str | None, output: Path) -> None:
    """A picture of the recent runs: timeline by verdict, steps over time, GPU memory."""
    from dflashd.logs.reader import RecordFilter, read_records
    from dflashd.supervisor.report import collect, render_html, summarize, svg_document

    where = _home(home)
    if not where.logs.is_dir():
        _fail(
            f"no logs in {where.root} (has dflashd been started with this home?)", EXIT_NOT_RUNNING
        )
    run = _resolve_run(where, which_run)
    data = collect(read_records(where.logs, RecordFilter(run=run, src="dflashd")))
    if not data.runs:
        _fail("no runs in the log" + (f" for run {run}" if run is not None else ""), 1)
    text = (
        svg_document(data)
        if output.suffix == ".svg"
        else render_html(data, f"dflashd runs on {where.root}")
    )
    try:
        output.write_text(text)
    except OSError as exc:
        _fail(f"cannot write {output}: {exc.strerror}", 1)
    info = summarize(data)
    verdicts = ", ".join(f"{k} {v}" for k, v in sorted(info["verdicts"].items()))
    click.echo(f"{output}: {info['runs']} runs ({verdicts}), {info['gpu_points']} GPU points")


# -- stop -------------------------------------------------------------------------------


@main.command()
@_home_option
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=0),
    default=None,
    help="Seconds between SIGTERM and SIGKILL [default: restart.stop_timeout_s].",
)
def stop(home: Path | None, timeout_s: float | None) -> None:
    """Stop the job (SIGTERM to its process group, SIGKILL after the timeout) and the daemon."""
    from dflashd.supervisor.control import ControlError, request
    from dflashd.supervisor.statefile import read_state

    where = _home(home)
    if not lock_is_held(where.lock):
        click.echo(f"dflashd is not running on {where.root}")
        return
    req: dict[str, Any] = {"cmd": "stop"}
    if timeout_s is not None:
        req["timeout_s"] = timeout_s
    try:
        request(where.control_socket, req)
    except ControlError as exc:
        _fail(f"cannot reach the daemon: {exc}", 1)
    wait_s = (timeout_s if timeout_s is not None else 30.0) + 30.0
    deadline = time.monotonic() + wait_s
    while lock_is_held(where.lock):
        if time.monotonic() > deadline:
            _fail(
                f"the daemon did not exit within {wait_s:.0f}s (pid {read_lock_pid(where.lock)})", 1
            )
        time.sleep(0.05)
    state = read_state(where.state_file) or {}
    last = state.get("last_exit") or {}
    click.echo(f"dflashd stopped (run {last.get('run')}: {last.get('verdict')})")


if __name__ == "__main__":  # pragma: no cover
    main()
