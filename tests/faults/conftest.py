"""Fixtures of the fault suite."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


def mounted_tmpfs(where: Path, options: str) -> Iterator[Path]:
    """A tmpfs mounted at ``where`` with ``options`` for the test's life (root only)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    where.mkdir(mode=0o700)
    mount = ["mount", "-t", "tmpfs", "-o", f"{options},mode=0700", "tmpfs", str(where)]
    if subprocess.run(mount, check=False, capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs (root only)."""
    yield from mounted_tmpfs(tmp_path / "small", "size=1m")


@pytest.fixture
def few_inodes(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs with 64 inodes (root only): out of inodes long before out of space."""
    yield from mounted_tmpfs(tmp_path / "inodes", "size=8m,nr_inodes=64")


def fill(path: Path) -> None:
    """Write zeros to ``path`` until the disk under it is full."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"\0" * 65536)
    except OSError:
        pass
    finally:
        os.close(fd)
