"""The ``dflashd`` command line (docs/design.md, "CLI"): start, status, tail, stop, restart, report.

Shell completion comes from click: ``eval "$(_DFLASHD_COMPLETE=bash_source dflashd)"`` (or
``zsh_source`` / ``fish_source``) in the shell's rc file.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Final

import click
import orjson

from dflashd.logs.safejson import dumps_any
from dflashd.supervisor import __version__
from dflashd.supervisor.client.common import (
    catch_ctrl_c,
    config_option,
    fail,
    home_option,
    resolve_home,
    timeout_option,
)
from dflashd.supervisor.client.habits import Commands, another_jobs_home
from dflashd.supervisor.client.start import (
    prepare,
    run_foreground,
    start_detached,
    start_interrupted,
)
from dflashd.supervisor.host.home import Home, already_running_message, lock_is_held, read_lock_pid
from dflashd.supervisor.model.exitcodes import EXIT_NOT_RUNNING, EXIT_USAGE
from dflashd.supervisor.model.lifecycle import State
from dflashd.supervisor.speak.invocation import has_run

# a daemon found gone in one of these states ended without recording its end
_LIVE_STATES: Final = frozenset({State.RUNNING, State.STARTING, State.BACKOFF, State.STOPPING})


@click.group(
    cls=Commands,
    context_settings={"help_option_names": ["-h", "--help"]},
    invoke_without_command=True,
)
@click.version_option(__version__, prog_name="dflashd")
@click.option(
    "--home",
    type=click.Path(file_okay=False, readable=False, path_type=Path),
    envvar="DFLASHD_HOME",  # the command's own --home, given after it, still wins
    default=None,
    help="State directory for every command [env DFLASHD_HOME].",
)
@click.pass_context
def main(ctx: click.Context, home: Path | None) -> None:
    """dflashd: a crash-resilient supervisor for long GPU training jobs.

    It logs before it launches, knows the moment the job dies and why, alerts, and
    restarts with backoff.  With no command, `dflashd start` runs the bundled DFlash
    drafter trainer.  The design and its contracts:

    \b
    DESIGN_PATH

    Shell completion: eval "$(_DFLASHD_COMPLETE=bash_source dflashd)".
    """
    ensure_standard_fds()
    ctx.obj = {"home": home}
    if ctx.invoked_subcommand is None:  # a bare `dflashd`: what it can do, and success
        click.echo(ctx.get_help())
        ctx.exit(0)
    if ctx.invoked_subcommand != "start":  # Ctrl-C is KeyboardInterrupt again (tail -f, a wait)
        catch_ctrl_c(signal.default_int_handler)


def ensure_standard_fds() -> None:
    """A closed stdin, stdout or stderr becomes /dev/null (as daemon(3) does): otherwise the
    next file dflashd opens would take its number, and prints would land in it."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
            if fd == 1 and sys.stdout is None:
                sys.stdout = open(1, "w", closefd=False)
            if fd == 2 and sys.stderr is None:
                sys.stderr = open(2, "w", closefd=False)


# docs/design.md ships inside the package: --help names the copy this install has.
_DESIGN = Path(__file__).parent.parent / "design.md"
main.help = (main.help or "").replace(
    "DESIGN_PATH", str(_DESIGN) if _DESIGN.is_file() else "docs/design.md in the source tree"
)

main.lazy_commands = {  # loaded when named: a start loads none of them
    "tail": "dflashd.supervisor.client.logcmds:tail",
    "logs": "dflashd.supervisor.client.logcmds:tail",  # journalctl's and pm2's word for it
    "report": "dflashd.supervisor.client.logcmds:report",
    "stacks": "dflashd.supervisor.client.stackscmd:stacks",
}


# The command begins at "--" or at the first word that is not an option: an unknown option
# before it (a typo, say) is a usage error with the nearest option suggested, never the job.
@main.command(context_settings={"allow_interspersed_args": False})
@home_option
@click.option(
    "--foreground",
    is_flag=True,
    help="Stay attached and show the job's output (systemd uses this).",
)
@click.option(
    "--no-wait",
    is_flag=True,
    help="Detached: return once the job is launched, without waiting for its first step.",
)
@config_option("TOML config (docs/design.md, Config); every key has a default.")
@click.option("--raw", is_flag=True, help="With --foreground: the job's lines bare, unprefixed.")
@click.option("--quiet", is_flag=True, help="With --foreground: do not show the job's output.")
@click.option("--ready-fd", type=int, default=None, hidden=True)
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def start(
    home: Path | None,
    foreground: bool,
    no_wait: bool,
    config_path: Path | None,
    raw: bool,
    quiet: bool,
    ready_fd: int | None,
    command: tuple[str, ...],
) -> None:
    """Start the daemon and launch the job: `dflashd start [--config F] [-- CMD ARG...]`.

    Detached (the default), it waits for the launch and then for the job's first step, its
    death, or start_wait_s (30 s), whichever comes first (--no-wait: not at all); a job that
    dies meanwhile is reported with its verdict and stderr tail.  Exits 0 when the job runs,
    1 if a daemon already runs on this home or the job died and is being restarted, 2 for a
    bad config, home or option, 4 when the job's failure is fatal (no retry).  The command
    begins at -- or at the first word that is not an option.
    """
    if command and command[0] == "--":
        command = command[1:]
    # detached, a Ctrl-C is one line and exit 130 from here on, whenever (start.py); the
    # foreground daemon takes its signals over itself once it serves
    catch_ctrl_c(signal.default_int_handler if foreground else start_interrupted)
    where = resolve_home(home)
    config = prepare(where, config_path, tuple(command))
    # the one-home warning is decided now (before this start rewrites the home's state) and
    # said only once the start goes ahead: a refused start says its one line and no more
    mixed = another_jobs_home(where, config.command) if ready_fd is None else None
    if foreground:
        if ready_fd is None and lock_is_held(where.lock):
            fail(already_running_message(where), 1)
        invocation = (config_path, tuple(command))
        run_foreground(  # becomes the daemon program: returns only through a refusal's exit
            where, config, ready_fd, echo=not quiet, raw=raw, saved=invocation, warning=mixed
        )
    # detached: the daemon records the invocation once it holds the lock (a refused start never)
    sys.exit(
        start_detached(where, config, config_path, tuple(command), wait=not no_wait, warning=mixed)
    )


@main.command()
@home_option
@click.option("--json", "as_json", is_flag=True, help="One JSON object (docs/design.md, Status).")
def status(home: Path | None, as_json: bool) -> None:
    """Show the daemon's state, the current run, the last exit and the GPUs.

    Exit 0 while the daemon runs, 3 when it does not (the last known state is still shown).
    """
    from dflashd.supervisor.client.render import Painter, format_status, use_color

    where = resolve_home(home)
    state, running = _current_state(where)
    if state is None:
        if as_json:
            empty = {"state": "stopped", "running": False, "home": str(where.root)}
            click.echo(orjson.dumps(empty).decode())
        else:
            click.echo(f"dflashd is not running (nothing recorded in {where.root})")
        sys.exit(EXIT_NOT_RUNNING)
    state.pop("config", None)
    state["running"] = running
    if not running and state.get("state") in _LIVE_STATES:
        state["state_note"] = "the daemon is gone without recording an end; this is its last state"
    if as_json:
        click.echo(dumps_any(state).decode())
    else:
        click.echo(format_status(state, running=running, paint=Painter(use_color(sys.stdout))))
    sys.exit(0 if running else EXIT_NOT_RUNNING)


def _current_state(home: Home) -> tuple[dict[str, Any] | None, bool]:
    """The live daemon's status, else the last state.json; and whether a daemon holds the home.

    "Running" is decided by the lock's holder, not by the socket: a daemon whose socket was
    deleted, or that is frozen, still runs; the state then says why it does not answer.
    """
    from dflashd.supervisor.speak.control import ControlError, request
    from dflashd.supervisor.speak.statusview import parse_state, read_state

    if not lock_is_held(home.lock):
        return read_state(home.state_file), False
    try:
        return parse_state(request(home.control_socket, {"cmd": "status"}, timeout_s=3.0)), True
    except ControlError as exc:
        state = read_state(home.state_file) or {"home": str(home.root)}
        state["state_note"] = not_answering(home, exc)
        return state, True


def not_answering(home: Home, exc: Exception) -> str:
    """``daemon pid N holds the home but does not answer: stopped (state T)?`` and the cause."""
    from dflashd.supervisor.host.procfs import holds_file, read_stat

    pid = read_lock_pid(home.lock)
    if pid is None or not holds_file(pid, home.lock):
        return f"a process holds {home.lock} but it cannot be named ({exc})"
    found = read_stat(pid)
    state = found.state if found is not None else "?"
    if state in ("T", "t"):
        guess = f"stopped (state {state}): `kill -CONT {pid}` resumes it"
    elif not home.control_socket.exists():
        guess = f"its control socket {home.control_socket} is missing (state {state})"
    else:
        guess = f"busy or hung (state {state}): {exc}"
    return f"daemon pid {pid} holds the home but does not answer: {guess}"


@main.command()
@home_option
@timeout_option("Seconds between SIGTERM and SIGKILL [default: restart.stop_timeout_s].")
def stop(home: Path | None, timeout_s: float | None) -> None:
    """Stop the job and the daemon: SIGTERM to the job's process group, SIGKILL to all of the
    run after the timeout (its processes found through its cgroup or pidfds, never by pattern)."""
    where = resolve_home(home)
    if not lock_is_held(where.lock):
        click.echo(f"dflashd is not running on {where.root}")
        return
    _stop(where, timeout_s)


def _stop_without_socket(home: Home, timeout_s: float | None, exc: Exception) -> dict[str, Any]:
    """The control socket is gone (deleted by hand): SIGTERM the proven lock holder instead.

    The daemon takes SIGTERM as ``stop`` with the config's ``restart.stop_timeout_s``.  A
    frozen daemon (state T) gets nothing: a signal would wait and act after this command
    reported its failure.
    """
    import signal

    from dflashd.supervisor.host.custody import signal_lock_holder
    from dflashd.supervisor.host.procfs import read_stat

    pid = read_lock_pid(home.lock)
    found = read_stat(pid) if pid is not None else None
    if home.control_socket.exists() or pid is None or found is None or found.state in "Tt":
        fail(f"cannot stop: {not_answering(home, exc)}; nothing was sent", 1)
    if not signal_lock_holder(pid, home.lock, signal.SIGTERM):
        fail(f"cannot reach the daemon: {exc}; pid {pid} does not hold {home.lock}", 1)
    note = (
        "" if timeout_s is None else " (--timeout not passed: it uses its configured stop timeout)"
    )
    click.echo(
        f"dflashd: {home.control_socket} is missing: sent SIGTERM to the daemon (pid {pid}){note}",
        err=True,
    )
    return {"ok": True}


_STOP_MARGIN_S = 30.0  # past the job's stop timeout and the dump: the daemon's own exit


def _stop(home: Home, timeout_s: float | None) -> None:
    from dflashd.supervisor.speak.control import ControlError, request
    from dflashd.supervisor.speak.statusview import read_state

    reply_within_s = 5.0
    req: dict[str, Any] = {"cmd": "stop", "expires_at": time.time() + reply_within_s}
    if timeout_s is not None:
        req["timeout_s"] = timeout_s
    try:
        reply = request(home.control_socket, req, timeout_s=reply_within_s)
    except ControlError as exc:
        reply = _stop_without_socket(home, timeout_s, exc)
    if not reply.get("ok"):
        fail(f"the daemon refused: {reply.get('error')}", EXIT_USAGE)
    # the reply says the timeout in effect (the config's when --timeout is not given) and the
    # stack dump's bound; a daemon reached by SIGTERM uses its configured one, unknown here
    in_effect = reply.get("timeout_s", timeout_s)
    if not isinstance(in_effect, int | float):
        in_effect = _configured_stop_timeout(home)
    dump = reply.get("dump_bound_s")
    wait_s = float(in_effect) + (float(dump) if isinstance(dump, int | float) else 10.0)
    wait_s += _STOP_MARGIN_S
    deadline = time.monotonic() + wait_s
    while lock_is_held(home.lock):
        if time.monotonic() > deadline:
            fail(
                f"the daemon did not exit within {wait_s:.0f}s (pid {read_lock_pid(home.lock)})", 1
            )
        time.sleep(0.05)  # the lock is another process's: no event to wait on
    state = read_state(home.state_file) or {}
    last = state.get("last_exit") or {}
    click.echo(f"dflashd stopped (run {last.get('run')}: {last.get('verdict')})")


def _configured_stop_timeout(home: Home) -> float:
    """The running daemon's ``restart.stop_timeout_s`` from its last state.json, else 30 s."""
    from dflashd.supervisor.speak.statusview import read_state

    value = (read_state(home.state_file) or {}).get("stop_timeout_s")
    return float(value) if isinstance(value, int | float) else 30.0


@main.command(name="ls")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per home.")
@click.option("--running", is_flag=True, help="Only the homes whose daemon runs now.")
@click.option(
    "--forget", metavar="HOME", help="Drop HOME from the list (nothing in it is touched)."
)
def list_homes(as_json: bool, running: bool, forget: str | None) -> None:
    """Every home you started, newest first: its state, run, step, goodput and command, like
    `pm2 ls` (root: every running daemon of every user too).  A state with `*` is not running:
    its last recorded state (fatal, completed, stopped).  Exit 0."""
    from dflashd.supervisor.client.listing import show_listing

    show_listing(as_json=as_json, running=running, forget=forget)


@main.command(context_settings={"allow_interspersed_args": False})
@home_option
@timeout_option("Seconds between SIGTERM and SIGKILL for the running job.")
@config_option("A config to start with instead of the last start's.")
@click.option(
    "--no-wait",
    is_flag=True,
    help="Return once the job is launched again, without waiting for its first step.",
)
@click.option(
    "--env-from-shell",
    is_flag=True,
    help="Run the job with this shell's environment instead of the last start's.",
)
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def restart(
    home: Path | None,
    timeout_s: float | None,
    config_path: Path | None,
    no_wait: bool,
    env_from_shell: bool,
    command: tuple[str, ...],
) -> None:
    """Stop the job and the daemon, then start again as the last `start` did (or as told here),
    in the directory it was started from and with the environment it was started with
    (--env-from-shell: this shell's; the config's `env` is applied over either).  The command
    is checked first: one that cannot be spawned is refused (exit 2) and the running job is
    left alone.  Without a command, a record of the last start that is missing or damaged
    (invocation.json) refuses the restart (exit 2): nothing is guessed."""
    where = resolve_home(home)
    if not has_run(where) and not lock_is_held(where.lock):  # a typo'd --home: start nothing
        fail(f"{where.root}: no job has run in this home, nothing to restart (dflashd start)", 2)
    command = tuple(command[1:] if command and command[0] == "--" else command)
    from dflashd.supervisor.client.replay import replay

    again = replay(where, command, config_path, env_from_shell=env_from_shell)
    config = prepare(where, again.config_path, again.command)  # checked before anything stops
    again.check(config)
    if lock_is_held(where.lock):  # only now: a restart that cannot launch stopped nothing
        _stop(where, timeout_s)
    code = start_detached(
        where, config, again.config_path, again.command, wait=not no_wait, env=again.env
    )
    sys.exit(code)


if __name__ == "__main__":  # pragma: no cover
    main()
