"""What users of other tools bring: their commands (``top``, ``ps``, ``kill``...) and the habit
of one home for every job, each answered with what it is here."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Final

import click

from dflashd.supervisor.client.lazycommands import LazyCommands
from dflashd.supervisor.host.home import Home

# What users of other tools type, and what it is here: never a guess at a command that ends the
# job (click's own "did you mean" turned `dflashd top` into `stop`).
HABITS: Final = {
    "top": "dflashd status (and `watch dflashd status` to keep it on screen)",
    "ps": "dflashd status",
    "list": "dflashd ls",
    "log": "dflashd logs (or dflashd tail -f)",
    "kill": "dflashd stop (SIGTERM to the job's process group, SIGKILL to all of the run after the timeout)",
    "reload": "dflashd restart",
    "show": "dflashd status",
    "stat": "dflashd status",  # a typo: never steered to `start` or `restart`
    "st": "dflashd status",
}
ENDING: Final = frozenset({"stop", "restart"})  # commands a typo must never be steered to


class Commands(LazyCommands):
    """The group, with a hint for other tools' habits and no guessed ``stop`` or ``restart``;
    the commands of other modules are loaded when named (``lazycommands.py``)."""

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name = args[0] if args else ""
        if name and self.get_command(ctx, name) is None and not name.startswith("-"):
            meant = HABITS.get(name)
            if meant is not None:
                raise click.UsageError(f"no command {name!r} here; you may mean: {meant}", ctx)
            close = difflib.get_close_matches(name, self.list_commands(ctx))
            if close and close[0] in ENDING:
                raise click.UsageError(f"no command {name!r} (dflashd --help lists them)", ctx)
        return super().resolve_command(ctx, args)


def another_jobs_home(home: Home, command: tuple[str, ...]) -> str | None:
    """A warning when ``start`` brings a different job into a home with history: restarts,
    goodput and the report would mix the two.  One home per job: a home named for it."""
    from dflashd.supervisor.speak.statusview import read_state

    state = read_state(home.state_file) or {}
    before = state.get("command")
    if not isinstance(before, list) or not before or [str(c) for c in before] == list(command):
        return None
    last = state.get("last_exit")
    if isinstance(last, dict) and last.get("run") == 1 and last.get("verdict") == "spawn_failed":
        return None  # its one run never started (a typo): no job before this one
    name = _job_name(command)
    shown = " ".join(str(c) for c in before)[:80]
    return (
        f"{home.root} ran another job before ({shown}): its restarts, goodput and report now "
        f"count this one with it. One home per job: --home {home.root.parent / name}"
    )


def _job_name(command: tuple[str, ...]) -> str:
    """A home's name for a job: its script's stem (``train.py`` -> ``dflashd-train``)."""
    # a file's name, never code (``python -c "import time; ..."`` names no script)
    words = [w for w in command if not w.startswith("-") and not any(c.isspace() for c in w)]
    script = next((w for w in words[1:] if "." in Path(w).name), words[-1] if words else "job")
    stem = "".join(c if c.isalnum() or c in "-_" else "-" for c in Path(script).stem)
    return f"dflashd-{stem or 'job'}"
