"""state.json: written atomically (temp file + rename) so ``status`` works with the daemon down."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson


def write_state(path: Path, state: dict[str, Any]) -> None:
    """Replace ``path`` with ``state`` in one rename: a reader sees the old file or the new one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    data = orjson.dumps(state, option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE, default=str)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def read_state(path: Path) -> dict[str, Any] | None:
    """The last state written, or None when there is none (or it is unreadable)."""
    try:
        obj = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return obj if isinstance(obj, dict) else None
