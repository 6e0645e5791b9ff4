"""Shared by the benchmark scripts: the foreground daemon's argv, other dflashd commands."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: find tests/

from tests.helpers import cli_argv as cli
from tests.helpers import daemon_argv

__all__ = ["cli", "daemon_argv", "status"]


def status(home: Path) -> dict[str, Any]:
    """`dflashd status --json` on ``home``."""
    done = subprocess.run(
        cli(home, "status", "--json"), capture_output=True, text=True, check=False
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def process_cpu_s(pid: int) -> float | None:
    """A live process's own CPU seconds (user + system, from /proc), None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
