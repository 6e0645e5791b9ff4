"""Reading a rotating log set: everything in order, the last N cheaply, and ``tail -F``.

Readers never trust file names alone: rotation renames files under them.  A scan opens
every file of the set first (logset.py pins the inodes and orders them by first ``seq``)
and skips any record at or below the last ``seq`` already seen, so a rotation during a
read neither repeats nor loses a record that is still on disk.
"""

from __future__ import annotations

import os
import re
import time
from collections import deque
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Final

from dflashd.logs.limits import DEFAULT_BASENAME
from dflashd.logs.logset import READ_BLOCK, OpenSet, parse_record, reverse_lines
from dflashd.logs.packed import is_packed
from dflashd.logs.records import EventRecord, LineRecord, Record


@dataclass(frozen=True, slots=True)
class RecordFilter:
    """Which records a reader keeps: by run, source, time and text (None keeps all)."""

    run: int | None = None
    src: str | None = None
    since_ts: str | None = None  # RFC 3339 UTC, compared as text (the format sorts)
    until_ts: str | None = None  # records after it are left out (same format)
    grep: re.Pattern[str] | None = None  # searched in a line's text or an event's name and fields
    skip_blank: bool = False  # whitespace-only lines (a progress bar's clears) left out
    skip_events: frozenset[str] = frozenset()  # supervisor records left out, by event name

    def keeps(self, record: Record) -> bool:
        """True when the record passes every criterion."""
        if self.skip_blank and isinstance(record, LineRecord) and not record.line.strip():
            return False
        if isinstance(record, EventRecord) and record.event in self.skip_events:
            return False
        if self.run is not None and record.run != self.run:
            return False
        if self.src is not None and record.src != self.src:
            return False
        if self.since_ts is not None and record.ts < self.since_ts:
            return False
        if self.until_ts is not None and record.ts > self.until_ts:
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
        rec = parse_record(raw)
        if rec is None or rec.seq < min_seq or rec.seq <= last[0]:
            continue
        last[0] = rec.seq
        if keep.keeps(rec):
            yield rec
    if progress is not None:
        progress(offset)
    if not is_packed(fh):
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
            rec = parse_record(buf[start:stop])
            if rec is not None and rec.seq >= min_seq and rec.seq > last[0]:
                last[0] = rec.seq
                if keep.keeps(rec):
                    yield rec
            pos = buf.find(mark, stop, end)
        if progress is not None:
            progress(end)
    if not is_packed(fh):
        fh.seek(offset)


def _last_ts(fh: BinaryIO) -> str | None:
    """The timestamp of a file's last complete record (None when it has none)."""
    for raw in reverse_lines(fh):
        rec = parse_record(raw)
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
    opened = OpenSet(Path(directory), basename)
    try:
        yield from _scan(opened, keep, min_seq, [min_seq - 1], progress)
    finally:
        opened.close()


def _scan(
    opened: OpenSet, keep: RecordFilter, min_seq: int, last: list[int], progress: Progress | None
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
        packed = is_packed(fh)  # progress counts bytes on disk: a .gz file's at its end
        yield from _read_from(fh, min_seq, keep, last, None if packed else progress)
        if packed and progress is not None:
            progress(os.fstat(fh.fileno()).st_size)


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
    opened = OpenSet(Path(directory), basename)
    try:
        for _, fh in reversed(opened.handles):
            for raw in reverse_lines(fh):
                rec = parse_record(raw)
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
                opened = OpenSet(directory, basename, strict=False)
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
            chunk = live.read(READ_BLOCK)
            if chunk:
                pending += chunk
                *complete, pending = pending.split(b"\n")
                for raw in complete:
                    rec = parse_record(raw + b"\n")
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
