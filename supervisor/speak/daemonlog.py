"""daemon.log, bounded: the detached daemon's own log rotates by size and count, like the run log.

The detached daemon's stdout and stderr are ``daemon.log`` (so a traceback from a C library
or a stray ``print`` lands there too).  :class:`DaemonLog` is the stream dflashd's own log writes to:
after each write it looks at the file's size (one ``fstat``) and, past ``max_bytes``, renames
``daemon.log`` → ``.1`` → … → ``.N`` (the oldest dropped), opens a fresh ``daemon.log`` and
``dup2``\\ s it onto fds 1 and 2, so stray writes follow.  At most ``backups + 1`` files of
``max_bytes`` plus one record each.  A failing disk never stops the daemon: the error is
swallowed and the next write tries again.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Final

_FLAGS: Final = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC


def rotated_name(path: Path, index: int) -> Path:
    """``daemon.log.3`` for index 3."""
    return path.with_name(f"{path.name}.{index}")


_current: DaemonLog | None = None


def reopen_daemon_log() -> None:
    """SIGHUP/SIGUSR1: daemon.log moved or deleted by an admin is opened afresh."""
    if _current is not None:
        _current.reopen()


class DaemonLog:
    """A text stream onto daemon.log that rotates it (and fds 1 and 2 with it)."""

    def __init__(self, path: Path, max_bytes: int, backups: int, fds: tuple[int, ...] = (1, 2)):
        global _current
        self.path, self.max_bytes, self.backups, self._fds = path, max_bytes, backups, fds
        self._lock = threading.Lock()
        self.rotations = 0
        _current = self

    def reopen(self) -> None:
        """Open daemon.log again onto fds 1 and 2 when the path no longer names our file."""
        with self._lock:
            if is_daemon_log(self._fds[-1], self.path):
                return
            try:
                fd = os.open(self.path, _FLAGS, 0o600)
            except OSError:
                return
            try:
                for target in self._fds:
                    os.dup2(fd, target)
            finally:
                os.close(fd)

    def write(self, text: str) -> int:
        """Write through fd 2 (daemon.log); rotate when it grew past ``max_bytes``."""
        data = text.encode("utf-8", "replace")
        with self._lock:
            try:
                os.write(self._fds[-1], data)
                if os.fstat(self._fds[-1]).st_size >= self.max_bytes:
                    self._rotate()
            except OSError:
                pass  # a full or failing disk: the daemon's own log must not stop the daemon
        return len(text)

    def flush(self) -> None:
        """Nothing is buffered."""

    def isatty(self) -> bool:
        """Never a terminal (the renderer is JSON)."""
        return False

    def _rotate(self) -> None:
        for index in range(self.backups, 0, -1):
            older = self.path if index == 1 else rotated_name(self.path, index - 1)
            if older.exists():
                os.replace(older, rotated_name(self.path, index))
        if self.backups == 0:
            self.path.unlink(missing_ok=True)
        fd = os.open(self.path, _FLAGS, 0o600)
        try:
            for target in self._fds:
                os.dup2(fd, target)
        finally:
            os.close(fd)
        self.rotations += 1


def is_daemon_log(fd: int, path: Path) -> bool:
    """True when ``fd`` is the file at ``path`` (the detached daemon's stderr is daemon.log)."""
    try:
        st, other = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == (other.st_dev, other.st_ino)
