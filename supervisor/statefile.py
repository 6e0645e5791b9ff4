"""state.json: written atomically (temp file + rename) so ``status`` works with the daemon down.

Read back through :func:`dflashd.supervisor.status.parse_state`: a file that is not JSON,
or JSON of the wrong shape, gives what is well-typed in it, never an exception.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson

_MAX_STATE_BYTES = 4 * 1024 * 1024


def write_state(path: Path, state: dict[str, Any]) -> None:
    """Replace ``path`` with ``state`` in one rename: a reader sees the old file or the new one.

    The temporary file is created exclusively and never through a symlink; the rename
    replaces whatever entry ``path`` is (a planted link included), never its target.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    data = orjson.dumps(state, option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE, default=str)
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
    os.replace(tmp, path)


def read_state(path: Path) -> dict[str, Any] | None:
    """The last state written, validated, or None when there is none (or it is unreadable)."""
    from dflashd.supervisor.status import parse_state

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as fh:
            raw = fh.read(_MAX_STATE_BYTES + 1)
    except OSError:
        return None
    if len(raw) > _MAX_STATE_BYTES:
        return None
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return parse_state(obj) if isinstance(obj, dict) else None
