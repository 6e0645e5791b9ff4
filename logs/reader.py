"""Reading a rotating log set: everything in order, the last N cheaply, and ``tail -F``.

Readers never trust file names alone: rotation renames files under them.  A scan opens
every file of the set first (pinning the inodes), orders them by their first ``seq``,
and skips any record at or below the last ``seq`` already seen, so a rotation during a
read neither repeats nor loses a record that is still on disk.
"""

from __future__ import annotations

import gzip
import os
import re
import time
from collections import deque
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Final, cast

from dflashd.logs.records import EventRecord, LineRecord, Record, RecordError, decode
from dflashd.logs.writer import DEFAULT_BASENAME

_BLOCK: Final = 256 * 1024
_OPEN_RETRIES: Final = 100


@dataclass(frozen=True, slots=True)
class RecordFilter:
    """Which records a reader keeps: by run, source, time and text (None keeps all)."""

    run: int | None = None
    src: str | None = None
    since_ts: str | None = None  # RFC 3339 UTC, compared as text (the format sorts)
    grep: re.Pattern[str] | None = None  # searched in a line's text or an event's name and fields

    def keeps(self, record: Record) -> bool:
        """True when the record passes every criterion."""
        if self.run is not None and record.run != self.run:
            return False
        if self.src is not None and record.src != self.src:
            return False
        if self.since_ts is not None and record.ts < self.since_ts:
            return False
        if self.grep is not None:
            text = record.line if isinstance(record, LineRecord) else _event_text(record)
            return self.grep.search(text) is not None
        return True


def _event_text(record: Record) -> str:
    if isinstance(record, EventRecord):
        fields = " ".join(f"{k}={v}" for k, v in record.fields.items())
        return f"{record.event} {fields}"
    return ""


KEEP_ALL: Final = RecordFilter()
Progress = Callable[[int], object]


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


def _packed(fh: BinaryIO) -> bool:
    return isinstance(fh, gzip.GzipFile)


def _parse(raw: bytes) -> Record | None:
    try:
        return decode(raw)
    except RecordError:
        return None


def _first_seq(fh: BinaryIO) -> int | None:
    fh.seek(0)
    for raw in fh:
        if not raw.endswith(b"\n"):
            return None
        rec = _parse(raw)
        if rec is not None:
            return rec.seq
    return None


class _OpenSet:
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
            first = _first_seq(fh)
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


def _read_from(
    fh: BinaryIO, min_seq: int, keep: RecordFilter, last: list[int], progress: Progress | None
) -> Iterator[Record]:
    """Records of one open file with seq >= min_seq; stops before a torn (unterminated) last line."""
    if keep.src == "dflashd":  # the supervisor's records only: find them without parsing the rest
        yield from _read_marked(fh, _DFLASHD_MARK, min_seq, keep, last, progress)
        return
    fh.seek(0)
    offset = 0
    for raw in fh:
        if not raw.endswith(b"\n"):
            break
        offset += len(raw)
        rec = _parse(raw)
        if rec is None or rec.seq < min_seq or rec.seq <= last[0]:
            continue
        last[0] = rec.seq
        if keep.keeps(rec):
            yield rec
    if progress is not None:
        progress(offset)
    if not _packed(fh):
        fh.seek(offset)


# Every supervisor record holds this exactly (encode_event); a child's line cannot, since its
# quotes are escaped inside "line".  A byte search finds the records; each is then parsed.
_DFLASHD_MARK: Final = b'"src":"dflashd"'
_CHUNK: Final = 8 << 20


def _read_marked(
    fh: BinaryIO,
    mark: bytes,
    min_seq: int,
    keep: RecordFilter,
    last: list[int],
    progress: Progress | None,
) -> Iterator[Record]:
    """The complete lines holding ``mark``, parsed and filtered; C-speed over the others."""
    fh.seek(0)
    carry, offset = b"", 0
    while chunk := fh.read(_CHUNK):
        buf = carry + chunk
        end = buf.rfind(b"\n") + 1  # complete lines only: a torn tail waits (or is dropped)
        carry = buf[end:]
        offset += end
        pos = buf.find(mark, 0, end)
        while pos >= 0:
            start = buf.rfind(b"\n", 0, pos) + 1
            stop = buf.find(b"\n", pos) + 1
            rec = _parse(buf[start:stop])
            if rec is not None and rec.seq >= min_seq and rec.seq > last[0]:
                last[0] = rec.seq
                if keep.keeps(rec):
                    yield rec
            pos = buf.find(mark, stop, end)
        if progress is not None:
            progress(end)
    if not _packed(fh):
        fh.seek(offset)


def _last_ts(fh: BinaryIO) -> str | None:
    """The timestamp of a file's last complete record (None when it has none)."""
    for raw in _reverse_lines(fh):
        rec = _parse(raw)
        if rec is not None:
            return rec.ts
    return None


def read_records(
    directory: Path | str,
    keep: RecordFilter = KEEP_ALL,
    *,
    basename: str = DEFAULT_BASENAME,
    min_seq: int = 0,
    progress: Progress | None = None,
) -> Iterator[Record]:
    """All records of the set in seq order, filtered; tolerant of rotation while reading.

    ``progress`` is called with the bytes read as they are read (a progress bar's update).
    With ``keep.since_ts``, a whole file that ends before it is skipped unread.
    """
    opened = _OpenSet(Path(directory), basename)
    try:
        yield from _scan(opened, keep, min_seq, [min_seq - 1], progress)
    finally:
        opened.close()


def _scan(
    opened: _OpenSet, keep: RecordFilter, min_seq: int, last: list[int], progress: Progress | None
) -> Iterator[Record]:
    handles = opened.handles
    # Skip whole files that end before min_seq: a file is needed only if the next one starts after it.
    start = 0
    for index in range(len(handles) - 1):
        if handles[index + 1][0] <= min_seq:
            start = index + 1
    for _, fh in handles[start:]:
        if keep.since_ts is not None and fh is not opened.live:
            ended = _last_ts(fh)
            if ended is not None and ended < keep.since_ts:  # the whole file is older
                if progress is not None:
                    progress(os.fstat(fh.fileno()).st_size)
                continue
        packed = _packed(fh)  # progress counts bytes on disk: a .gz file's at its end
        yield from _read_from(fh, min_seq, keep, last, None if packed else progress)
        if packed and progress is not None:
            progress(os.fstat(fh.fileno()).st_size)


def _reverse_lines(fh: BinaryIO) -> Iterator[bytes]:
    """Complete lines of a file from the last to the first, reading blocks backwards.

    A compressed rotated file cannot be read backwards: it is decompressed whole (one file
    of at most ``max_bytes``, only when the newer files did not hold enough lines).
    """
    if _packed(fh):
        fh.seek(0)
        lines = fh.read().split(b"\n")
        yield from reversed(lines[:-1])  # the text after the last newline is not a line
        return
    end = fh.seek(0, os.SEEK_END)
    carry = b""
    first_block = True
    while end > 0:
        start = max(0, end - _BLOCK)
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


def last_records(
    directory: Path | str,
    count: int,
    keep: RecordFilter = KEEP_ALL,
    *,
    basename: str = DEFAULT_BASENAME,
    progress: Progress | None = None,
) -> list[Record]:
    """The last ``count`` matching records, oldest first, reading only the end of the set.

    ``progress`` gets each file's size once it has been read through (a progress bar).
    """
    if count <= 0:
        return []
    found: deque[Record] = deque()
    opened = _OpenSet(Path(directory), basename)
    try:
        for _, fh in reversed(opened.handles):
            for raw in _reverse_lines(fh):
                rec = _parse(raw)
                if rec is None or not keep.keeps(rec):
                    continue
                if found and rec.seq >= found[0].seq:
                    continue  # same record seen through a renamed file
                found.appendleft(rec)
                if len(found) >= count:
                    return list(found)
            if progress is not None:
                progress(os.fstat(fh.fileno()).st_size)
    finally:
        opened.close()
    return list(found)


def follow(
    directory: Path | str,
    keep: RecordFilter = KEEP_ALL,
    *,
    basename: str = DEFAULT_BASENAME,
    after_seq: int = 0,
    poll_s: float = 0.1,
    should_stop: Callable[[], bool] = lambda: False,
) -> Generator[Record, None, None]:
    """Yield records with seq > after_seq as they are written, across rotations (like ``tail -F``).

    Ends when ``should_stop()`` returns True (checked at least every ``poll_s``).
    """
    directory = Path(directory)
    live_path = directory / basename
    last = [after_seq]
    live: BinaryIO | None = None
    pending = b""
    try:
        while True:
            if live is None:
                opened = _OpenSet(directory, basename)
                try:
                    yield from _scan(opened, keep, last[0] + 1, last, None)
                except BaseException:
                    opened.close()
                    raise
                live = opened.live
                opened.close(keep_live=True)
                pending = b""
                if live is None:
                    if should_stop():
                        return
                    time.sleep(poll_s)
                    continue
            chunk = live.read(_BLOCK)
            if chunk:
                pending += chunk
                *complete, pending = pending.split(b"\n")
                for raw in complete:
                    rec = _parse(raw + b"\n")
                    if rec is None or rec.seq <= last[0]:
                        continue
                    last[0] = rec.seq
                    if keep.keeps(rec):
                        yield rec
                continue
            if _replaced(live, live_path):
                live.close()
                live = None  # rescan: picks up whatever was rotated past us
                continue
            if should_stop():
                return
            time.sleep(poll_s)
    finally:
        if live is not None:
            live.close()


def _replaced(fh: BinaryIO, path: Path) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return True
    own = os.fstat(fh.fileno())
    return (st.st_dev, st.st_ino) != (own.st_dev, own.st_ino)
