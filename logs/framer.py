"""Bytes in arbitrary chunks in, lines out.

The framer works per chunk, not per byte: the common case (a chunk of ``\\n``-terminated
lines, no ``\\r``, none longer than ``max_line_bytes``) is one ``decode`` and one
``split``, both in C.  Everything else (``\\r\\n``, tqdm-style ``\\r`` redraws, overlong
lines) takes a slower, exact path.

Guarantees, for any byte stream chunked any way:
- valid UTF-8 comes back exactly (:func:`dflashd.logs.records.reassemble`);
- invalid bytes become U+FFFD, never an exception;
- no line grows past ``max_line_bytes``: it is cut (at a character boundary) into
  ``partial`` pieces, and a ``\\r`` ends a line so progress bars don't pile up;
- what is left without a terminator when the stream ends is flushed as ``partial``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

DEFAULT_MAX_LINE_BYTES: Final = 64 * 1024
_TERMINATOR = re.compile(rb"\r\n|\r|\n")


@dataclass(frozen=True, slots=True)
class Frame:
    """The lines framed from one chunk.

    ``flags`` is ``None`` in the common case (every line complete, ended by ``\\n``);
    otherwise one ``(partial, eol)`` pair per line, ``eol`` being ``None`` for ``\\n``.
    ``nbytes`` is the number of input bytes this frame accounts for.
    """

    lines: list[str]
    flags: list[tuple[bool, str | None]] | None
    nbytes: int

    def __len__(self) -> int:
        return len(self.lines)


def _utf8_cut(data: bytes, limit: int) -> int:
    """Where to cut ``data`` at or before ``limit`` without splitting a UTF-8 character."""
    cut = limit
    # Back off over at most three continuation bytes (10xxxxxx) to the start of a character.
    while cut > limit - 3 and cut > 0 and (data[cut] & 0xC0) == 0x80:
        cut -= 1
    return cut if cut > 0 and (data[cut] & 0xC0) != 0x80 else limit


def _decode(data: bytes) -> str:
    return data.decode("utf-8", "replace")


class LineFramer:
    """Stateful framer for one stream; not thread-safe (one per pipe reader)."""

    def __init__(self, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> None:
        if max_line_bytes < 4:
            raise ValueError("max_line_bytes must be at least 4")
        self.max_line_bytes = max_line_bytes
        self._pending = b""

    @property
    def pending_bytes(self) -> int:
        """Bytes held back waiting for a terminator."""
        return len(self._pending)

    def feed(self, chunk: bytes) -> Frame | None:
        """Frame one chunk; returns the complete lines (and cut pieces) it finished."""
        if not chunk:
            return None
        buf = self._pending + chunk if self._pending else chunk
        limit = self.max_line_bytes
        if b"\r" not in buf:
            last_nl = buf.rfind(b"\n")
            if last_nl == -1:
                self._pending = buf
                return self._cut_pending() if len(buf) > limit else None
            complete = buf[:last_nl]
            if len(buf) <= limit or max(map(len, complete.split(b"\n"))) <= limit:
                self._pending = buf[last_nl + 1 :]
                frame = Frame(_decode(complete).split("\n"), None, last_nl + 1)
                if len(self._pending) > limit:
                    return _merge(frame, self._cut_pending())
                return frame
        return self._feed_general(buf)

    def _feed_general(self, buf: bytes) -> Frame | None:
        lines: list[str] = []
        flags: list[tuple[bool, str | None]] = []
        start = 0
        consumed = 0
        for match in _TERMINATOR.finditer(buf):
            term = match.group()
            if term == b"\r" and match.end() == len(buf):
                break  # may be the first half of a "\r\n" split across chunks
            self._append_line(buf[start : match.start()], term, lines, flags)
            start = consumed = match.end()
        self._pending = buf[start:]
        frame = Frame(lines, flags, consumed) if lines else None
        if len(self._pending) > self.max_line_bytes:
            return _merge(frame, self._cut_pending())
        return frame

    def _append_line(
        self,
        data: bytes,
        term: bytes,
        lines: list[str],
        flags: list[tuple[bool, str | None]],
    ) -> None:
        limit = self.max_line_bytes
        while len(data) > limit:
            cut = _utf8_cut(data, limit)
            lines.append(_decode(data[:cut]))
            flags.append((True, None))
            data = data[cut:]
        lines.append(_decode(data))
        flags.append((False, None if term == b"\n" else term.decode("ascii")))

    def _cut_pending(self) -> Frame | None:
        """Cut the held-back bytes into ``partial`` pieces until less than a line's worth is left."""
        limit = self.max_line_bytes
        lines: list[str] = []
        consumed = 0
        data = self._pending
        while len(data) > limit:
            cut = _utf8_cut(data, limit)
            lines.append(_decode(data[:cut]))
            data = data[cut:]
            consumed += cut
        self._pending = data
        if not lines:
            return None
        return Frame(lines, [(True, None)] * len(lines), consumed)

    def flush(self) -> Frame | None:
        """Emit whatever is held back as one ``partial`` record (stream ended, or the child died)."""
        if not self._pending:
            return None
        data, self._pending = self._pending, b""
        if data.endswith(b"\r"):
            # A lone trailing "\r" that never got its "\n": it was a terminator after all.
            return Frame([_decode(data[:-1])], [(False, "\r")], len(data))
        return Frame([_decode(data)], [(True, None)], len(data))


def _merge(first: Frame | None, second: Frame | None) -> Frame | None:
    if first is None:
        return second
    if second is None:
        return first
    complete: tuple[bool, str | None] = (False, None)
    first_flags = first.flags if first.flags is not None else [complete] * len(first.lines)
    second_flags = second.flags if second.flags is not None else [complete] * len(second.lines)
    return Frame(
        first.lines + second.lines, first_flags + second_flags, first.nbytes + second.nbytes
    )
