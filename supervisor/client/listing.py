"""``dflashd ls``: every home of this user (root: every running daemon of every user), like
``pm2 ls`` or ``supervisorctl status``.

Homes come from three places: the registry of every home this user started
(:mod:`~dflashd.supervisor.speak.registry`: fatal, completed and stopped ones too), each live
process whose command line is a dflashd daemon, read from /proc (its home from ``--home DIR``,
``--home=DIR``, its ``DFLASHD_HOME`` or its default, a relative one against its cwd), and this
user's default home when it has a history.  Each home is read from its state.json (opened
without following links, validated as ``status`` validates it); no daemon is asked anything,
so a hostile or hung one cannot stall the listing.  Newest first.
"""

from __future__ import annotations

import math
import os
import pwd
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import orjson

from dflashd.supervisor.host.handover import DAEMON_MODULE
from dflashd.supervisor.host.home import Home, default_home, lock_is_held
from dflashd.supervisor.model.goodput import duration_text
from dflashd.supervisor.speak.echo import escape_controls
from dflashd.supervisor.speak.registry import forget as drop
from dflashd.supervisor.speak.registry import forget_gone, remembered
from dflashd.supervisor.speak.statusview import read_state


@dataclass(frozen=True, slots=True)
class Listed:
    """One home as ``ls`` shows it."""

    home: str
    user: str
    running: bool
    state: dict[str, Any]

    def row(self) -> dict[str, Any]:
        """The ``--json`` object, and what the table prints."""
        view = self.state
        goodput = view.get("goodput") if isinstance(view.get("goodput"), dict) else {}
        ratio = goodput.get("ratio") if isinstance(goodput, dict) else None
        raw = view.get("command")
        command: list[Any] = raw if isinstance(raw, list) else []
        return {
            "home": self.home,
            "user": self.user,
            "running": self.running,
            "state": view.get("state") if self.running else f"{view.get('state') or 'stopped'}*",
            "run": view.get("run"),
            "step": view.get("step"),
            "goodput": ratio,
            "wall_s": goodput.get("wall_s") if isinstance(goodput, dict) else None,
            # what the ratio is of, as status says it: the wall time less the stopped time
            "working_s": _working(goodput) if isinstance(goodput, dict) else None,
            "command": " ".join(str(c) for c in command),
        }


def _working(goodput: dict[str, Any]) -> float | None:
    wall, stopped = goodput.get("wall_s"), goodput.get("stopped_s") or 0.0
    if isinstance(wall, int | float) and isinstance(stopped, int | float):
        return max(0.0, float(wall) - float(stopped))
    return None


def daemon_homes(proc: Path = Path("/proc")) -> dict[str, int]:
    """The home of every live dflashd daemon on this host, with its owner's uid."""
    found: dict[str, int] = {}
    try:
        entries = os.listdir(proc)
    except OSError:
        return found
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(proc / name / "cmdline", "rb") as fh:
                argv = fh.read(65536).split(b"\0")
            uid = os.stat(proc / name).st_uid
        except OSError:
            continue
        words = [a.decode("utf-8", "replace") for a in argv if a]
        if not _is_daemon(words):
            continue
        home = _home_of(proc / name, words)
        if home:
            found.setdefault(home, uid)
    return found


def _home_of(entry: Path, words: list[str]) -> str | None:
    """A daemon's home, however it was given: ``--home DIR``, ``--home=DIR``, its environment's
    ``DFLASHD_HOME`` or its default (a relative one taken against its cwd)."""
    home = None
    for index, word in enumerate(words):
        if word == "--home" and index + 1 < len(words):
            home = words[index + 1]
        elif word.startswith("--home="):
            home = word[len("--home=") :]
        elif word == "--":
            break
    if home is None:
        env = _environ(entry)
        state = env.get("XDG_STATE_HOME") or (env.get("HOME", "") + "/.local/state")
        home = env.get("DFLASHD_HOME") or (state + "/dflashd" if state.startswith("/") else None)
    if home is None or home.startswith("/"):
        return home
    try:
        return os.path.join(os.readlink(entry / "cwd"), home)
    except OSError:
        return home


def _environ(entry: Path) -> dict[str, str]:
    try:
        with open(entry / "environ", "rb") as fh:
            raw = fh.read(1 << 20)
    except OSError:
        return {}
    pairs = (item.decode("utf-8", "replace").partition("=") for item in raw.split(b"\0") if item)
    return {key: value for key, _, value in pairs}


def _is_daemon(words: list[str]) -> bool:
    """A daemon's command line: dflashd's module, script or daemon program, ``start``,
    ``--foreground`` (the program ``start`` becomes keeps those words: ``host/handover.py``)."""
    names = ("dflashd.supervisor", DAEMON_MODULE, "dflashd")
    ours = any(w in names or w.endswith("/dflashd") for w in words)
    return ours and "start" in words and "--foreground" in words


def listed(
    *,
    everyone: bool,
    proc: Path = Path("/proc"),
    running_only: bool = False,
    registry: Path | None = None,
) -> list[Listed]:
    """Every home to show, newest first: the running daemons' (this user's, or everyone's for
    root), every home this user started (the registry; gone ones dropped from it) and this
    user's default home when it has a history.  Each home is read without following a link or
    blocking on a FIFO (a broken home, a loop, another user's: its row says little, the
    listing goes on)."""
    me = os.getuid()
    homes = {h: uid for h, uid in daemon_homes(proc).items() if everyone or uid == me}
    started = remembered(registry)
    gone = [h for h in started if h not in homes and not _is_dir(h)]
    forget_gone(gone, registry)
    for home in started:
        if home not in gone:
            homes.setdefault(home, me)
    mine = str(default_home().expanduser().absolute())
    if (Path(mine) / "state.json").exists():
        homes.setdefault(mine, me)
    out = []
    for root, uid in homes.items():
        where = Home(Path(root))
        running = lock_is_held(where.lock)
        if running_only and not running:
            continue
        state = read_state(where.state_file) or {}
        out.append(Listed(root, _user(uid), running, state))
    return sorted(out, key=lambda e: (-_newest(e, started), e.home))


def _is_dir(home: str) -> bool:
    try:
        return os.path.isdir(home)
    except (OSError, ValueError):
        return False


def _newest(entry: Listed, started: dict[str, float]) -> float:
    """When the home last started a job: the registry's, or its state's."""
    at: object = started.get(entry.home)
    if at is None:
        at = entry.state.get("started_at")
    if isinstance(at, int | float) and not isinstance(at, bool) and math.isfinite(at):
        return float(at)
    return 0.0


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def table(rows: list[dict[str, Any]], *, users: bool) -> str:
    """The listing as aligned columns (``*``: not running, its last recorded state)."""
    head = ["HOME", *(["USER"] if users else []), "STATE", "RUN", "STEP", "GOODPUT", "COMMAND"]
    lines = [head]
    for r in rows:
        goodput = "-" if r["goodput"] is None else f"{r['goodput'] * 100:.1f} %"
        if r["goodput"] is not None and r["working_s"]:
            goodput += f" of {duration_text(float(r['working_s']))}"
        cells = [r["home"], *([r["user"]] if users else []), str(r["state"])]
        cells += [_dash(r["run"]), _dash(r["step"]), goodput, str(r["command"])[:60]]
        # a home path or a command may hold a newline or an escape sequence: one row, escaped
        lines.append([escape_controls(str(c)) for c in cells])
    widths = [max(len(line[i]) for line in lines) for i in range(len(head) - 1)]
    return "\n".join(
        "  ".join([*(c.ljust(w) for c, w in zip(line[:-1], widths, strict=True)), line[-1]])
        for line in lines
    )


def _dash(value: object) -> str:
    return "-" if value is None else str(value)


def show_listing(*, as_json: bool, running: bool, forget: str | None) -> None:
    """``dflashd ls``: the table (or JSON lines), or ``--forget HOME``."""
    if forget is not None:
        said = "forgotten" if drop(forget) else "was not listed"
        click.echo(f"{escape_controls(forget)}: {said}")
        return
    everyone = os.geteuid() == 0
    rows = [entry.row() for entry in listed(everyone=everyone, running_only=running)]
    if as_json:
        for row in rows:
            click.echo(orjson.dumps(row).decode())
    elif not rows:
        click.echo(
            "no dflashd running" if running else "no dflashd here (dflashd start to begin one)"
        )
    else:
        click.echo(table(rows, users=everyone))
        if any(not r["running"] for r in rows):
            click.echo("* not running: the state it ended in (ls --running: live ones only)")
