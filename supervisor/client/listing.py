"""``dflashd ls``: every dflashd of this user (root: of every user), like ``pm2 ls`` or
``supervisorctl status``.

The daemons are found where they run: each live process whose command line is a dflashd
daemon (``... dflashd... start --foreground --home DIR``), read from /proc, plus this user's
default home when it has a history.  Each home is read from its state.json (opened without
following links, validated as ``status`` validates it); no daemon is asked anything, so a
hostile or hung one cannot stall the listing.
"""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dflashd.supervisor.host.home import Home, default_home, lock_is_held
from dflashd.supervisor.model.goodput import duration_text
from dflashd.supervisor.speak.echo import escape_controls
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
            "command": " ".join(str(c) for c in command),
        }


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
        home = words[words.index("--home") + 1] if "--home" in words[:-1] else None
        if home:
            found.setdefault(home, uid)
    return found


def _is_daemon(words: list[str]) -> bool:
    """A daemon's command line: dflashd's module or script, ``start``, ``--foreground``."""
    ours = any(w == "dflashd.supervisor" or w.endswith("/dflashd") or w == "dflashd" for w in words)
    return ours and "start" in words and "--foreground" in words


def listed(*, everyone: bool, proc: Path = Path("/proc")) -> list[Listed]:
    """Every home to show: the running daemons' (this user's, or everyone's for root), and
    this user's default home when it has a history.  Each home is read without following a
    link or blocking on a FIFO (a broken home, a loop, another user's: its row says little,
    the listing goes on)."""
    me = os.getuid()
    homes = {h: uid for h, uid in daemon_homes(proc).items() if everyone or uid == me}
    mine = str(default_home().expanduser().absolute())
    if (Path(mine) / "state.json").exists():
        homes.setdefault(mine, me)
    out = []
    for root, uid in sorted(homes.items()):
        where = Home(Path(root))
        state = read_state(where.state_file) or {}
        out.append(Listed(root, _user(uid), lock_is_held(where.lock), state))
    return out


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
        if r["goodput"] is not None and r["wall_s"]:
            goodput += f" of {duration_text(float(r['wall_s']))}"
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
