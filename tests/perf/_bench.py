"""Shared by the benchmark scripts: the foreground daemon's argv."""

from __future__ import annotations

import sys
from pathlib import Path


def daemon_argv(
    home: Path, config: Path, command: list[str], *, flags: tuple[str, ...] = ("--quiet",)
) -> list[str]:
    """`dflashd start --foreground` on ``home`` with ``config``, supervising ``command``.

    ``flags`` default to ``--quiet`` (no echo of the job's output); pass ``()`` to echo.
    """
    return [
        sys.executable,
        "-m",
        "dflashd.supervisor",
        "start",
        "--foreground",
        *flags,
        "--home",
        str(home),
        "--config",
        str(config),
        "--",
        *command,
    ]
