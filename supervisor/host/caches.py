"""The compile caches dflashd owns, and clearing them after an early death.

dflashd points inductor's and triton's caches at ``<home>/cache/torchinductor`` and
``<home>/cache/triton``.  It only ever removes a directory it made: each one it creates
holds a mark file (:data:`CACHE_MARK`) with the home's id, written at creation.  A
directory of that name that is the user's (no mark, another id, a symlink, a file) is
used as it is and never cleared; the ``cache_cleared`` record says which were kept and why.
Nothing outside those marked directories is touched, whatever ``--home`` points at.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

CACHE_MARK: Final = ".dflashd-cache"
OWNED_CACHES: Final = ("torchinductor", "triton")
_ASIDE: Final = ".cleared-"


@dataclass(slots=True)
class CacheClearing:
    """What one clearing did: the caches cleared, and those kept with the reason."""

    cleared: list[str] = field(default_factory=list)
    kept: dict[str, str] = field(default_factory=dict)


def _write_mark(directory: Path, home_id: str) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(directory / CACHE_MARK, flags, 0o600)
    try:
        os.write(fd, f"{home_id}\n".encode())
    finally:
        os.close(fd)


def _make_marked(directory: Path, home_id: str) -> None:
    os.mkdir(directory, 0o700)
    _write_mark(directory, home_id)


def ownership(directory: Path, home_id: str) -> str | None:
    """None when ``directory`` is a real directory dflashd made for this home; else why not."""
    try:
        st = os.lstat(directory)
    except FileNotFoundError:
        return "absent"
    except OSError as exc:
        return f"unreadable ({exc.strerror})"
    if stat.S_ISLNK(st.st_mode):
        return "a symlink, not made by dflashd"
    if not stat.S_ISDIR(st.st_mode):
        return "not a directory"
    if st.st_uid != os.geteuid():
        return f"owned by uid {st.st_uid}"
    try:
        fd = os.open(directory / CACHE_MARK, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return "not made by dflashd (no mark)"
    except OSError as exc:
        return f"mark unreadable ({exc.strerror})"
    try:
        mark = os.read(fd, 256).decode(errors="replace").strip()
    finally:
        os.close(fd)
    if not home_id or mark != home_id:
        return "made by another dflashd home"
    return None


def prepare_caches(cache_root: Path, home_id: str) -> None:
    """Make the owned cache directories that are missing (marked), and finish clearings a dead
    daemon left half-done (marked asides only).  Never raises: a cache is a convenience."""
    for name in OWNED_CACHES:
        with contextlib.suppress(OSError):
            _make_marked(cache_root / name, home_id)
    try:
        entries = os.listdir(cache_root)
    except OSError:
        return
    for entry in entries:
        if entry.startswith(".") and _ASIDE in entry:
            aside = cache_root / entry
            if ownership(aside, home_id) is None:
                _remove_in_background(aside)


def clear_owned_cache(cache_root: Path, home_id: str) -> CacheClearing:
    """Clear every owned cache directory that carries this home's mark.

    Each is moved aside (one rename within ``cache_root``: the next child never sees half a
    cache), made again with its mark, and the old one deleted off the daemon's loop.  A
    directory without the mark is the user's: kept, with the reason.
    """
    result = CacheClearing()
    for name in OWNED_CACHES:
        path = cache_root / name
        why = ownership(path, home_id)
        if why == "absent":
            with contextlib.suppress(OSError):
                _make_marked(path, home_id)
            continue
        if why is not None:
            result.kept[name] = why
            continue
        aside = cache_root / f".{name}{_ASIDE}{os.getpid()}-{time.monotonic_ns()}"
        try:
            os.rename(path, aside)
        except OSError as exc:
            result.kept[name] = f"cannot move aside ({exc.strerror})"
            continue
        with contextlib.suppress(OSError):
            _make_marked(path, home_id)
        _remove_in_background(aside)
        result.cleared.append(name)
    return result


def extensions_root(env: dict[str, str]) -> Path:
    """Where torch JIT-builds extensions for a child with this environment (never dflashd's:
    ``TORCH_EXTENSIONS_DIR``, else torch's default under the user's cache)."""
    explicit = env.get("TORCH_EXTENSIONS_DIR")
    if explicit:
        return Path(explicit)
    cache = env.get("XDG_CACHE_HOME") or os.path.join(env.get("HOME") or "~", ".cache")
    return Path(cache).expanduser() / "torch_extensions"


def stale_build_locks(root: Path, older_than_wall: float, limit: int = 20) -> tuple[str, ...]:
    """Build locks under ``root`` (``<root>/<py_cu>/<name>/lock``) older than the run: a build
    killed mid-way leaves one, and torch then waits on it forever.  Named in the exit record
    and the alert with the path to remove; dflashd never deletes them."""
    found: list[str] = []
    try:
        for lock in sorted(root.glob("*/*/lock")):
            st = os.lstat(lock)
            if stat.S_ISREG(st.st_mode) and st.st_mtime < older_than_wall:
                found.append(str(lock))
                if len(found) >= limit:
                    break
    except OSError:
        return tuple(found)
    return tuple(found)


def file_age(path: str, now_wall: float) -> float | None:
    """Seconds since ``path`` was last modified (None: gone or unreadable)."""
    try:
        return round(max(0.0, now_wall - os.lstat(path).st_mtime), 1)
    except OSError:
        return None


def _remove_in_background(path: Path) -> None:
    # rmtree never follows a symlink inside the tree; deleting a large cache takes seconds.
    threading.Thread(
        target=shutil.rmtree, args=(path, True), name="dflashd-rm-cache", daemon=True
    ).start()
