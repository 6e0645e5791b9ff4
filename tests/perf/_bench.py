"""Shared by the benchmark scripts: the foreground daemon's argv, other dflashd commands."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any


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


def cli(home: Path, *args: str) -> list[str]:
    """The dflashd command ``args`` on ``home`` (``--home`` goes last: no ``--`` in ``args``)."""
    return [sys.executable, "-m", "dflashd.supervisor", *args, "--home", str(home)]


def status(home: Path) -> dict[str, Any]:
    """`dflashd status --json` on ``home``."""
    done = subprocess.run(
        cli(home, "status", "--json"), capture_output=True, text=True, check=False
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result
