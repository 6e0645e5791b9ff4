"""Where a log set resumes after a crash: its file names and its last complete record.

:func:`recover_tail` gives the next ``seq`` and the last run from the newest complete
record (through a compressed rotated file if need be) and cuts a torn last line off the
live file, so the writer continues with whole records only.
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path
from typing import Final

import orjson

from dflashd.logs.packed import PACKED_SUFFIXES, last_line_packed

_TAIL_SCAN_BYTES: Final = 64 * 1024


def rotated_paths(directory: Path, basename: str, backups: int) -> list[Path]:
    """All file names of one log set, oldest first (``base.N`` … ``base.1``, ``base``)."""
    return [directory / f"{basename}.{i}" for i in range(backups, 0, -1)] + [directory / basename]


def numbered_files(directory: Path | int, basename: str) -> dict[int, list[str]]:
    """The set's rotated files present now, by number: ``{3: ["base.3.zst"], 1: ["base.1"]}``.

    One directory scan, whatever ``backups`` is (a rotation used to stat every possible name);
    the readers list the set through it too (:func:`dflashd.logs.logset.log_files`).
    """
    try:
        entries = os.listdir(directory)
    except FileNotFoundError:
        return {}
    return numbered_names(entries, basename)


def numbered_names(names: list[str], basename: str) -> dict[int, list[str]]:
    """The rotated files among ``names``, by number (the set's one pattern)."""
    pattern = re.compile(re.escape(basename) + r"\.(\d+)(\.gz|\.zst)?$")
    found: dict[int, list[str]] = {}
    for name in names:
        if (match := pattern.match(name)) is not None:
            found.setdefault(int(match.group(1)), []).append(name)
    return found


def plain_rotated(directory: Path | int, basename: str, backups: int) -> list[Path]:
    """The set's rotated files not yet compressed, oldest first, as named now (``directory``
    may be a held directory's descriptor: the paths are then bare names)."""
    present = numbered_files(directory, basename)
    folder = directory if isinstance(directory, Path) else Path()
    return [
        folder / f"{basename}.{number}"
        for number in sorted((n for n in present if n <= backups), reverse=True)
        if f"{basename}.{number}" in present[number]
    ]


def _last_complete_line(path: Path) -> tuple[bytes | None, int]:
    """The last newline-terminated line of ``path`` and the size of the file up to its end.

    Scans backwards in blocks, so a 100 MiB file costs one or two reads.
    """
    with open(path, "rb") as fh:
        size = fh.seek(0, os.SEEK_END)
        end = size
        tail = b""
        while end > 0:
            start = max(0, end - _TAIL_SCAN_BYTES)
            fh.seek(start)
            tail = fh.read(end - start) + tail
            end = start
            last_nl = tail.rfind(b"\n")
            if last_nl == -1:
                continue
            good_size = end + last_nl + 1
            prev_nl = tail.rfind(b"\n", 0, last_nl)
            if prev_nl != -1 or end == 0:
                return tail[prev_nl + 1 : last_nl], good_size
        return None, 0


def recover_tail(directory: Path, basename: str, backups: int) -> tuple[int, int, int]:
    """(next seq, last run, torn bytes): read from the last complete record on disk.

    A crash mid-write left a torn record at the end of the live file: it is cut off, so
    the file holds whole records only.  Never reads, let alone truncates, through a link.
    """
    live = directory / basename
    torn = 0
    try:
        present = set(os.listdir(directory))  # one listing, not a stat per possible backup name
    except FileNotFoundError:
        present = set()  # nothing written yet
    for path in reversed(rotated_paths(directory, basename, backups)):
        if path.name not in present and not any(path.name + s in present for s in PACKED_SUFFIXES):
            continue
        if path.is_symlink():
            if path == live:
                raise OSError(errno.ELOOP, "a symlink is there; refusing to follow it", str(path))
            continue
        twins = [path.with_name(path.name + suffix) for suffix in PACKED_SUFFIXES]
        packed = next((t for t in twins if t.is_file() and not t.is_symlink()), None)
        if not path.exists() and packed is not None:
            line = last_line_packed(packed)  # a compressed rotated file: read to its end
        else:
            if not path.exists() or path.stat().st_size == 0:
                continue
            line, good_size = _last_complete_line(path)
            size = path.stat().st_size
            if path == live and good_size < size:
                torn = size - good_size
                os.truncate(path, good_size)
        if line is None:
            continue
        try:
            obj = orjson.loads(line)
            return int(obj["seq"]) + 1, int(obj.get("run", 0)), torn
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            continue
    return 1, 0, torn
