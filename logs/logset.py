"""The files of one rotating log set: their names, opening them, and reading one backwards.

``base`` is the live file; ``base.1`` … ``base.N`` the rotated ones, newest first, each
possibly compressed (``base.N.gz``, logs/compress.py).  :class:`OpenSet` opens every file
at once, deduplicated by inode and ordered by first ``seq``, so a rotation while reading
neither repeats nor loses a record that is still on disk (reader.py builds on it).
"""

from __future__ import annotations

import gzip
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, Final, cast

from dflashd.logs.records import Record, RecordError, decode
from dflashd.logs.writer import DEFAULT_BASENAME

READ_BLOCK: Final = 256 * 1024
_OPEN_RETRIES: Final = 100


def log_files(directory: Path, basename: str = DEFAULT_BASENAME) -> list[Path]:
    """The files of one set as they are named now, oldest first.

    A rotated file is ``base.N`` or, once compressed, ``base.N.gz``; while the compressor
    swaps one for the other both exist for a moment, and the plain one is listed.
    """
    pattern = re.compile(re.escape(basename) + r"\.(\d+)(\.gz)?$")
    numbered: dict[int, Path] = {}
    try:
        entries = list(directory.iterdir())
    except FileNotFoundError:
        return []
    for entry in entries:
        match = pattern.match(entry.name)
        if match:
            number = int(match.group(1))
            if number not in numbered or not match.group(2):
                numbered[number] = entry
    files = [numbered[n] for n in sorted(numbered, reverse=True)]
    live = directory / basename
    if live.exists():
        files.append(live)
    return files


def _number(path: Path) -> int:
    """3 for ``base.3`` and ``base.3.gz``."""
    name = path.name[: -len(".gz")] if path.name.endswith(".gz") else path.name
    return int(name.rsplit(".", 1)[1])


def open_log_file(path: Path) -> BinaryIO:
    """A log file for reading: a compressed rotated one is decompressed as it is read."""
    if path.name.endswith(".gz"):
        return cast(BinaryIO, gzip.open(path, "rb"))
    return open(path, "rb")


def is_packed(fh: BinaryIO) -> bool:
    return isinstance(fh, gzip.GzipFile)


def parse_record(raw: bytes) -> Record | None:
    try:
        return decode(raw)
    except RecordError:
        return None


def first_seq(fh: BinaryIO) -> int | None:
    fh.seek(0)
    for raw in fh:
        if not raw.endswith(b"\n"):
            return None
        rec = parse_record(raw)
        if rec is not None:
            return rec.seq
    return None


class OpenSet:
    """Every file of the set opened at once, deduplicated by inode, ordered by first seq."""

    def __init__(self, directory: Path, basename: str) -> None:
        self.handles: list[tuple[int, BinaryIO]] = []
        self.live: BinaryIO | None = None
        # A rotation between listing and opening shifts names by one: retry until the names
        # still point at what we opened, so no renamed file slips between two names.
        for _ in range(_OPEN_RETRIES):
            if self._open_all(directory, basename):
                break
            self.close()
            self.handles, self.live = [], None
        self.handles.sort(key=lambda item: item[0])

    def _open_all(self, directory: Path, basename: str) -> bool:
        seen: set[tuple[int, int]] = set()
        opened: list[tuple[Path, tuple[int, int]]] = []
        live_path = directory / basename
        names = log_files(directory, basename)
        numbers = [_number(p) for p in names if p != live_path]
        if numbers != list(range(len(numbers), 0, -1)):
            return False  # a hole: a rotation's rename chain is in flight, or the listing raced it
        for path in names:
            try:
                fh = open_log_file(path)
            except FileNotFoundError:
                return False
            st = os.fstat(fh.fileno())
            inode = (st.st_dev, st.st_ino)
            opened.append((path, inode))
            if inode in seen:
                fh.close()
                continue
            seen.add(inode)
            first = first_seq(fh)
            if path == live_path:
                self.live = fh
            self.handles.append((first if first is not None else 1 << 62, fh))
        for path, inode in opened:
            try:
                st = os.stat(path)
            except FileNotFoundError:
                return False
            if (st.st_dev, st.st_ino) != inode:
                return False
        return True

    def close(self, keep_live: bool = False) -> None:
        for _, fh in self.handles:
            if keep_live and fh is self.live:
                continue
            fh.close()


def reverse_lines(fh: BinaryIO) -> Iterator[bytes]:
    """Complete lines of a file from the last to the first, reading blocks backwards.

    A compressed rotated file cannot be read backwards: it is decompressed whole (one file
    of at most ``max_bytes``, only when the newer files did not hold enough lines).
    """
    if is_packed(fh):
        fh.seek(0)
        lines = fh.read().split(b"\n")
        yield from reversed(lines[:-1])  # the text after the last newline is not a line
        return
    end = fh.seek(0, os.SEEK_END)
    carry = b""
    first_block = True
    while end > 0:
        start = max(0, end - READ_BLOCK)
        fh.seek(start)
        block = fh.read(end - start) + carry
        end = start
        lines = block.split(b"\n")
        carry = lines[0]
        tail = lines[1:]
        if first_block:
            # The text after the last newline is a torn or in-progress record: not yet a line.
            tail = tail[:-1]
            first_block = False
        yield from reversed(tail)
    if carry and not first_block:
        yield carry
