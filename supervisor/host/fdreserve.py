"""A few descriptors held in reserve, given up when the process runs out (EMFILE).

Out of descriptors, a daemon can neither launch (pipes), nor answer, nor write a record
saying why.  Holding a handful of /dev/null descriptors and freeing them at that moment
turns a fatal EMFILE into a transient one: the launch is retried with the room they leave,
and the reserve is taken again afterwards.
"""

from __future__ import annotations

import contextlib
import os
from typing import Final

RESERVE_FDS: Final = 8


class FdReserve:
    """``RESERVE_FDS`` descriptors on /dev/null, released on demand, retaken later."""

    def __init__(self, count: int = RESERVE_FDS) -> None:
        self.count = count
        self._fds: list[int] = []
        self.take()

    @property
    def held(self) -> int:
        return len(self._fds)

    def take(self) -> None:
        """Fill the reserve up again (as far as the process allows)."""
        while len(self._fds) < self.count:
            try:
                self._fds.append(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
            except OSError:
                return

    def release(self) -> int:
        """Give every reserved descriptor back; how many were freed."""
        freed = len(self._fds)
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds = []
        return freed
