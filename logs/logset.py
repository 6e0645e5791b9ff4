"""The files of one rotating log set: their names, opening them, and reading one backwards.

``base`` is the live file; ``base.1`` … ``base.N`` the rotated ones, newest first, each
possibly compressed (``base.N.zst``, or ``base.N.gz`` from before; logs/packed.py).  :class:`OpenSet` opens every file
at once, deduplicated by inode and ordered by first ``seq``, so a rotation while reading
neither repeats nor loses a record that is still on disk (reader.py builds on it).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, Final

from dflashd.logs.limits import DEFAULT_BASENAME
from dflashd.logs.packed import (
    PACKED_SUFFIXES,
    is_packed,
    open_log_file,
    packed_suffix,
    read_all,
    say_skipped,
    unpacked_name,
)
from dflashd.logs.records import Record, RecordError, decode
from dflashd.logs.resume import numbered_files

READ_BLOCK: Final = 256 * 1024
_OPEN_RETRIES: Final = 20  # fast retries: a rotation's rename chain is usually done by then
_HOLE_SETTLE_S: Final = 0.2  # a hole seen in the same listing after this long is real (deleted)
_OPEN_GIVE_UP_S: Final = 5.0  # the set never settles (rotating without pause): try again later


def log_files(directory: Path, basename: str = DEFAULT_BASENAME) -> list[Path]:
    """The files of one set as they are named now, oldest first.

    A rotated file is ``base.N`` or, once compressed, ``base.N.zst`` (``.gz`` before); while the compressor
    swaps one for the other both exist for a moment, and the plain one is listed.
    """
    numbered = numbered_files(directory, basename)
    # The plain name wins over its packed twin (min keeps the first of equals).
    files = [
        directory / min(numbered[n], key=lambda name: bool(packed_suffix(name)))
        for n in sorted(numbered, reverse=True)
    ]
    live = directory / basename
    if live.exists():
        files.append(live)
    return files


def _snapshot(directory: Path, basename: str) -> list[tuple[str, int]]:
    """The set's names and their inodes now."""
    out = []
    for path in log_files(directory, basename):
        try:
            out.append((path.name, os.stat(path).st_ino))
        except OSError:
            out.append((path.name, -1))
    return out


class LogSetUnsettled(OSError):
    """A one-shot read could not open the set consistently (it never stopped changing): an
    I/O failure to its callers (those that keep going on OSError keep going)."""


def _packed_twin(path: Path) -> Path | None:
    """``base.N.zst`` (or ``.gz``) beside a plain ``base.N`` that is gone, if it exists."""
    if packed_suffix(path.name):
        return None
    for suffix in PACKED_SUFFIXES:
        twin = path.with_name(path.name + suffix)
        if twin.exists():
            return twin
    return None


def _unpacked(paths: list[Path]) -> list[str]:
    return [unpacked_name(p.name) for p in paths]


def _number(path: Path) -> int:
    """3 for ``base.3``, ``base.3.zst`` and ``base.3.gz``."""
    return int(unpacked_name(path.name).rsplit(".", 1)[1])


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

    def __init__(
        self,
        directory: Path,
        basename: str,
        *,
        strict: bool = True,
        give_up_s: float = _OPEN_GIVE_UP_S,
    ) -> None:
        self.handles: list[tuple[int, BinaryIO]] = []
        self.live: BinaryIO | None = None
        # A rotation between listing and opening shifts names by one: retry until the names
        # still point at what we opened, so no renamed file slips between two names.  A hole
        # in the numbering that outlasts the retries is real (a file deleted by hand): what is
        # intact is read, and the hole is said on stderr.
        started = time.monotonic()
        attempt, first_seen = 0, None
        while True:
            snapshot = _snapshot(directory, basename)
            if first_seen is None:
                first_seen = (time.monotonic(), snapshot)
            # A hole is real when nothing moved for _HOLE_SETTLE_S: the same names on the same
            # inodes (a rotation renames every file, so it always changes this).
            settled = (
                snapshot == first_seen[1] and time.monotonic() - first_seen[0] >= _HOLE_SETTLE_S
            )
            if self._open_all(directory, basename, holes_ok=settled):
                break
            self.close()
            self.handles, self.live = [], None
            if snapshot != first_seen[1]:
                first_seen = (time.monotonic(), snapshot)
            attempt += 1
            if time.monotonic() - started > give_up_s:
                if strict:  # a one-shot reader never returns "nothing" for "could not read"
                    raise LogSetUnsettled(
                        f"{directory}: the log set kept changing for {give_up_s:.0f}s "
                        "(rotating without pause); nothing was read, try again"
                    )
                break  # never settled: nothing opened now; a follower looks again later
            if attempt > _OPEN_RETRIES:
                time.sleep(0.01)  # a long rename chain (hundreds of backups) is still running
        self.handles.sort(key=lambda item: item[0])

    def _open_all(self, directory: Path, basename: str, *, holes_ok: bool) -> bool:
        seen: set[tuple[int, int]] = set()
        opened: list[tuple[Path, tuple[int, int]]] = []
        live_path = directory / basename
        names = log_files(directory, basename)
        numbers = [_number(p) for p in names if p != live_path]
        expected = list(range(len(numbers), 0, -1))
        if numbers != expected and not holes_ok:
            return False  # a hole: a rotation's rename chain is in flight, or the listing raced it
        if numbers and holes_ok:
            missing = sorted(set(range(1, max(numbers) + 1)) - set(numbers))
            if missing:
                named = ", ".join(f"{basename}.{n}" for n in missing)
                say_skipped(f"{directory}: {named} missing from the log set; read the rest")
        for index, listed in enumerate(names):
            path = listed
            try:
                fh = open_log_file(path)
            except FileNotFoundError:
                # compressed since the listing: its packed twin holds the same records
                twin = _packed_twin(path) if path != live_path else None
                if twin is None:
                    return False
                names[index] = path = twin
                fh = open_log_file(path)
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
                # a plain file compressed meanwhile (its twin took its place, under the
                # rotation lock): the records opened are the same.  A rotation also changes
                # the live file's inode, checked here too, so a rotation is never missed.
                if path != live_path and _packed_twin(path) is not None:
                    continue
                return False
            if (st.st_dev, st.st_ino) != inode:
                return False
        # A rotation between the listing and the opens adds a name (the live file opened is
        # already the next one, and the file it replaced is .1 now): the set must be listed
        # the same after the opens, or the file that moved would be skipped.  A compression
        # only changes a name's suffix: the same records, not a change of the set.
        return _unpacked(log_files(directory, basename)) == _unpacked(names)

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
        lines = read_all(fh).split(b"\n")
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
