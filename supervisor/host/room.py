"""How much room a filesystem has: the reading a relaunch held for room waits on (a rule's
``RoomHold``, model/verdicts.py)."""

from __future__ import annotations

import os
from pathlib import Path


def room_at(path: str, cwd: str) -> tuple[int, int] | None:
    """(free, size) bytes of the filesystem holding ``path`` (relative: to ``cwd``; empty:
    ``cwd`` itself), read at its nearest existing directory (a checkpoint file that could not
    be written may not exist); free is what an unprivileged writer may use.  None: unreadable."""
    where = Path(cwd).expanduser() / path if path else Path(cwd).expanduser()
    for candidate in (where, *where.parents):
        try:
            found = os.statvfs(candidate)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError:
            return None
        return found.f_bavail * found.f_frsize, found.f_blocks * found.f_frsize
    return None
