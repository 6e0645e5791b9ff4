"""Shared by the benchmark scripts: the foreground daemon's argv."""

from __future__ import annotations

import sys
from pathlib import Path


def daemon_argv(home: Path, config: Path, command: list[str]) -> list[str]:
    """`dflashd start --foreground` on ``home`` with ``config``, supervising ``command``."""
    return [
        sys.executable,
        "-m",
        "dflashd.supervisor",
        "start",
        "--foreground",
        "--home",
        str(home),
        "--config",
        str(config),
        "--",
        *command,
    ]
