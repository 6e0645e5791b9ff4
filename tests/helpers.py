"""Test helpers that need no pytest: the real CLI, a tiny TOML writer, the test children.

Shared by conftest.py and by the standalone scenario scripts (tests/multinode), which also
run on machines without pytest.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import pytest

CHILDREN = Path(__file__).parent / "children"


def child(name: str, *args: str) -> list[str]:
    """argv for one of the test children."""
    return [sys.executable, str(CHILDREN / name), *args]


def read_to_end(fd: int) -> bytes:
    """Everything a pipe's writers send until they all close it; then ``fd`` is closed."""
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


def dflashd_argv(*args: str) -> list[str]:
    """The real CLI, run by this interpreter."""
    return [sys.executable, "-m", "dflashd.supervisor", *args]


def daemon_argv(
    home: Path,
    config: Path | None = None,
    command: list[str] | None = None,
    *,
    flags: tuple[str, ...] = ("--quiet",),
) -> list[str]:
    """The foreground daemon on ``home``: the one place the tests build its command line.

    ``flags`` default to ``--quiet`` (no echo of the job's output); ``command`` None runs
    the configured job (the bundled trainer by default).
    """
    argv = dflashd_argv("start", "--foreground", *flags, "--home", str(home))
    if config is not None:
        argv += ["--config", str(config)]
    return argv + (["--", *command] if command else [])


def cli_argv(home: Path, *args: str) -> list[str]:
    """The dflashd command ``args`` on ``home`` (``--home`` last: no ``--`` in ``args``)."""
    return dflashd_argv(*args, "--home", str(home))


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run one dflashd command to completion."""
    return subprocess.run(
        dflashd_argv(*args), capture_output=True, text=True, timeout=timeout, check=False
    )


def toml_value(value: object) -> str:
    """A tiny TOML encoder for the values tests use."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + "}"
    return str(value)


def write_config(path: Path, top: Mapping[str, object], **tables: Mapping[str, object]) -> Path:
    """Write a TOML config with top-level keys and [tables]."""
    lines = [f"{k} = {toml_value(v)}" for k, v in top.items()]
    for name, table in tables.items():
        lines.append(f"[{name}]")
        lines.extend(f"{k} = {toml_value(v)}" for k, v in table.items())
    path.write_text("\n".join(lines) + "\n")
    return path


@contextmanager
def tmpfs(mount: Path, size: str) -> Iterator[Path]:
    """A small tmpfs mounted at ``mount`` for the test (skipped where this machine will not
    mount one: root only), unmounted after."""
    mount.mkdir(exist_ok=True)
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
