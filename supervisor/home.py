"""The home directory (DESIGN §3): its paths, and the one-daemon-per-home lock."""

from __future__ import annotations

import fcntl
import os
from dataclasses import dataclass
from pathlib import Path


def default_home() -> Path:
    """``$DFLASHD_HOME``, else ``$XDG_STATE_HOME/dflashd``, else ``~/.local/state/dflashd``."""
    explicit = os.environ.get("DFLASHD_HOME")
    if explicit:
        return Path(explicit)
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "dflashd"


@dataclass(frozen=True, slots=True)
class Home:
    """Every file the daemon keeps, under one directory."""

    root: Path

    @property
    def lock(self) -> Path:
        return self.root / "dflashd.lock"

    @property
    def control_socket(self) -> Path:
        return self.root / "control.sock"

    @property
    def notify_socket(self) -> Path:
        return self.root / "notify.sock"

    @property
    def state_file(self) -> Path:
        return self.root / "state.json"

    @property
    def daemon_log(self) -> Path:
        return self.root / "daemon.log"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def cache(self) -> Path:
        return self.root / "cache"

    @property
    def runs_db(self) -> Path:
        return self.root / "runs.sqlite"

    def create(self) -> None:
        """Make the directories, owner-only (the control socket lives here)."""
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)
        self.logs.mkdir(exist_ok=True)
        self.cache.mkdir(exist_ok=True)


class AlreadyRunning(Exception):
    """Another daemon holds this home's lock; carries its pid when known."""

    def __init__(self, pid: int | None) -> None:
        super().__init__(pid)
        self.pid = pid


class HomeLock:
    """An flock on ``dflashd.lock`` held for the daemon's life; the file records the holder's pid."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise :class:`AlreadyRunning`."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise AlreadyRunning(read_lock_pid(self.path)) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        """Drop the lock (the kernel also drops it when the process dies)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_lock_pid(path: Path) -> int | None:
    """The pid written by the lock's holder, if readable."""
    try:
        return int(path.read_text().strip() or "0") or None
    except (OSError, ValueError):
        return None


def lock_is_held(path: Path) -> bool:
    """True when a live daemon holds the lock (probe with a non-blocking shared lock)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False
