"""Every home this user started, remembered, as pm2 keeps what it ran: ``dflashd ls`` lists
them whatever became of their daemons (fatal, completed, stopped) and however their home was
given (``--home``, ``--home=DIR``, ``DFLASHD_HOME``, the default).

One small file in the user's state directory (``$XDG_STATE_HOME/dflashd-homes.json``, else
``~/.local/state/dflashd-homes.json``), 0600: ``{"homes": {path: last start, wall clock}}``.
It is rewritten whole (a temporary file renamed over it) under an ``flock`` on a lock file
beside it, so twenty concurrent starts all land.  A daemon adds its home once it holds the
home's lock; ``ls`` drops homes that are gone, ``ls --forget HOME`` one the user names.  A
registry that cannot be read or written is never an error: ``ls`` still finds the running
daemons in /proc, and a start goes ahead.
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import orjson

MAX_HOMES: Final = 1000  # the newest; a user with more has a script, not a habit
MAX_BYTES: Final = 4 << 20


def registry_path() -> Path:
    """``$XDG_STATE_HOME/dflashd-homes.json``, else ``~/.local/state/dflashd-homes.json``."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "dflashd-homes.json"


def _read(path: Path) -> dict[str, float]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return {}
    try:
        with os.fdopen(fd, "rb") as fh:
            raw = fh.read(MAX_BYTES + 1)
        data = orjson.loads(raw) if len(raw) <= MAX_BYTES else None
    except (OSError, orjson.JSONDecodeError):
        return {}
    homes = data.get("homes") if isinstance(data, dict) else None
    if not isinstance(homes, dict):
        return {}
    return {
        str(home): float(at)
        for home, at in homes.items()
        if isinstance(home, str)
        and home.startswith("/")
        and "\0" not in home
        and isinstance(at, int | float)
        and not isinstance(at, bool)
        and math.isfinite(at)
    }


def remembered(path: Path | None = None) -> dict[str, float]:
    """The homes remembered, each with its last start (wall clock); never raises."""
    return _read(path or registry_path())


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path.with_name(path.name + ".lock"), flags, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _write(path: Path, homes: dict[str, float]) -> None:
    newest = dict(sorted(homes.items(), key=lambda kv: -kv[1])[:MAX_HOMES])
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(orjson.dumps({"homes": newest}, option=orjson.OPT_INDENT_2))
    os.replace(tmp, path)


def _changed(path: Path, change: dict[str, float | None]) -> None:
    """Apply ``change`` (a home -> its start, or None to forget it) under the lock."""
    with contextlib.suppress(OSError), _locked(path):
        homes = _read(path)
        for home, at in change.items():
            if at is None:
                homes.pop(home, None)
            else:
                homes[home] = at
        _write(path, homes)


def remember(home: Path, path: Path | None = None, now: float | None = None) -> None:
    """This home started a job now (by the daemon, once it holds the home's lock)."""
    at = time.time() if now is None else now
    _changed(path or registry_path(), {str(home.expanduser().absolute()): at})


def forget(home: str, path: Path | None = None) -> bool:
    """Drop ``home`` from the list (as given, or made absolute); True when it was there."""
    where = path or registry_path()
    known = _read(where)
    names = {home, str(Path(home).expanduser().absolute())} & set(known)
    if names:
        _changed(where, dict.fromkeys(names))
    return bool(names)


def forget_gone(homes: list[str], path: Path | None = None) -> None:
    """Drop homes whose directory is gone (deleted since their start)."""
    if homes:
        _changed(path or registry_path(), dict.fromkeys(homes))
