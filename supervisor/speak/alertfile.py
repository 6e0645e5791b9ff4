"""The ``file`` alert sink: each alert one JSON line, appended to a file of the daemon's user.

Its own module so that :mod:`alerts` (the dispatcher) stays one concern: a sink is a
deliverer named in ``AlertDispatcher.from_config``; this one answers ``(ok, detail)``.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import Any

from dflashd.logs.safejson import dumps_any


def append_alert(path: str, payload: dict[str, Any]) -> tuple[bool, str]:
    """The ``file`` sink: the alert as one JSON line, appended in one write (lines from two
    daemons never interleave), to a regular file of this user's, created 0600; a link in
    the path's last component is refused, never followed."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as exc:
        why = "a symlink, refused" if exc.errno == errno.ELOOP else exc.strerror
        return False, f"{path}: {why}"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return False, f"{path}: not a regular file"
        if st.st_uid != os.geteuid():
            return False, f"{path}: belongs to uid {st.st_uid}"
        os.write(fd, dumps_any(payload) + b"\n")
    except OSError as exc:
        return False, f"{path}: {exc.strerror}"
    finally:
        os.close(fd)
    return True, "appended"
