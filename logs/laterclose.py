"""Descriptors closed on a thread of their own, off the log writer's path.

A removed file's blocks are freed when its last descriptor closes, not when its name goes:
ext4 took ~55 ms to free a 100 MiB log file already written back (~6 ms for one still in the
page cache; 2-core box, issue 53).  Rotation removes the oldest file on the writer's thread,
under its lock, while the job's lines queue up behind it; :meth:`LogDir.unlink
<dflashd.logs.logdir.LogDir.unlink>` holds the file (an ``O_PATH`` reference) across the
unlink and hands the descriptor here, so only a name goes on the writer's thread.
"""

from __future__ import annotations

import os
import queue
import threading
from typing import Final

THREAD_NAME: Final = "dflashd-closer"
_fds: queue.SimpleQueue[int] = queue.SimpleQueue()
_started = threading.Lock()
_thread: threading.Thread | None = None
_idle = threading.Condition()
_pending = 0


def close_later(fd: int) -> None:
    """Close ``fd`` on the closer thread (started at the first call)."""
    global _thread, _pending
    with _idle:
        _pending += 1
    with _started:
        if _thread is None:
            _thread = threading.Thread(target=_run, name=THREAD_NAME, daemon=True)
            _thread.start()
    _fds.put(fd)


def wait_closed(timeout_s: float) -> bool:
    """Until every descriptor handed over so far is closed (tests; an exit needs no wait: the
    process's end closes what is left)."""
    with _idle:
        return _idle.wait_for(lambda: _pending == 0, timeout_s)


def _run() -> None:
    global _pending
    while True:
        fd = _fds.get()
        try:
            os.close(fd)
        except OSError:
            pass
        with _idle:
            _pending -= 1
            _idle.notify_all()
