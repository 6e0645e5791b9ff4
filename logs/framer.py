"""Bytes in arbitrary chunks in, lines out.

The framer works per chunk, not per byte: the common case (a chunk of ``\\n``-terminated
lines of printable ASCII, no ``\\r``, none longer than ``max_line_bytes``) is one
``linecodec.CODEC.scan`` and no split at all; other text is one ``decode`` and
one ``split``, both in C.  Everything else (``\\r\\n``, tqdm-style ``\\r`` redraws, overlong
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
from typing import Final

from dflashd.logs.limits import MIN_LINE_BYTES
from dflashd.logs.linecodec import CODEC

DEFAULT_MAX_LINE_BYTES: Final = 64 * 1024

_TERMINATOR = re.compile(rb"\r\n|\r|\n")


class Frame:
    """The lines framed from one chunk.

    ``flags`` is ``None`` in the common case (every line complete, ended by ``\\n``);
    otherwise one ``(partial, eol)`` pair per line, ``eol`` being ``None`` for ``\\n``.
    ``nbytes`` is the number of input bytes this frame accounts for.

    For the commonest input of all (printable ASCII without quotes or backslashes) the
    framer keeps the lines as they came, joined by ``\\n`` (``text``): bytes that are
    already valid JSON string content, never split into objects on the hot path; the
    lines are decoded only if someone asks for :attr:`lines`.
    """

    __slots__ = ("_lines", "count", "flags", "nbytes", "parts", "text")

    def __init__(
        self,
        lines: list[str] | None,
        flags: list[tuple[bool, str | None]] | None,
        nbytes: int,
        text: bytes | None = None,
        count: int | None = None,
        parts: list[bytes] | None = None,
    ) -> None:
        if lines is None and text is None:
            raise ValueError("a frame needs lines or text")
        self._lines = lines
        self.text = text
        self.parts = parts  # text split at its newlines, where the Python scan did it already
        self.flags = flags
        self.nbytes = nbytes
        if lines is not None:
            self.count = len(lines)
        else:
            self.count = count if count is not None else (text or b"").count(b"\n") + 1

    @property
    def lines(self) -> list[str]:
        """The lines as text (decoded on first use for a JSON-safe frame)."""
        if self._lines is None:
            self._lines = (self.text or b"").decode("ascii").split("\n")
        return self._lines

    def last_lines(self, n: int) -> list[str]:
        """The last ``n`` lines as text, without decoding the rest."""
        if n <= 0:
            return []
        if self._lines is None and self.text is not None:
            # The frame's last bytes first, where n lines of up to ~256 bytes lie: one decode
            # and one split (the drain's tail asks this of every frame, a flood's 256 KiB ones
            # included; n searches back were most of the drain's own Python in a flood).
            text = self.text
            guess = text[-n * _LINE_GUESS :] if len(text) > n * _LINE_GUESS else text
            parts = guess.decode("ascii").split("\n")
            if len(parts) > n or guess is text:
                return parts[-n:]  # more than n: the first, cut at the guess, is left out
            # longer lines: from the end, n newlines back (rsplit(b"\n", n) copied the whole
            # frame before them too)
            start = len(text)
            for _ in range(n):
                start = text.rfind(b"\n", 0, start)
                if start < 0:
                    break
            return [raw.decode("ascii") for raw in text[start + 1 :].split(b"\n")]
        return self.lines[-n:]

    def __len__(self) -> int:
        return self.count

    def __repr__(self) -> str:
        return f"Frame(lines={self.lines!r}, flags={self.flags!r}, nbytes={self.nbytes})"


# bytes a line is guessed to take at most when the last lines of a frame's text are wanted
_LINE_GUESS: Final = 256


def _utf8_cut(data: bytes, limit: int) -> int:
    """Where to cut ``data`` at or before ``limit`` without splitting a UTF-8 character."""
    cut = limit
    # Back off over at most three continuation bytes (10xxxxxx) to the start of a character.
    while cut > limit - 3 and cut > 0 and (data[cut] & 0xC0) == 0x80:
        cut -= 1
    return cut if cut > 0 and (data[cut] & 0xC0) != 0x80 else limit


def _fits(lines: list[str], limit: int) -> bool:
    """True when no line is longer than ``limit`` bytes once encoded."""
    return all(
        len(line.encode("utf-8", "surrogatepass")) <= limit
        for line in lines
        if len(line) * 4 > limit
    )


def _decode(data: bytes) -> str:
    return data.decode("utf-8", "replace")


class LineFramer:
    """Stateful framer for one stream; not thread-safe (one per pipe reader)."""

    def __init__(self, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> None:
        if max_line_bytes < MIN_LINE_BYTES:
            raise ValueError(f"max_line_bytes must be at least {MIN_LINE_BYTES}")
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
        pending = self._pending
        limit = self.max_line_bytes
        if b"\r" in chunk or b"\r" in pending:
            return self._feed_general(pending + chunk if pending else chunk)
        last_nl = chunk.rfind(b"\n")
        if last_nl == -1:
            self._pending = pending + chunk
            return self._cut_pending() if len(self._pending) > limit else None
        # the held-back bytes and the chunk's complete lines, in one copy (a flood's frames are
        # 256 KiB: a copy of each saved is a tenth of the drain thread's time)
        complete = b"".join((pending, memoryview(chunk)[:last_nl])) if pending else chunk[:last_nl]
        size = len(pending) + len(chunk)
        nbytes = len(pending) + last_nl + 1
        if CODEC.split is not None:  # the Python loops: the lines are kept for the encoder
            parts = CODEC.split(complete, limit)
            count = len(parts) if parts is not None else -1
        else:
            parts, count = None, CODEC.scan(complete, limit)
        if count > 0:  # JSON-safe ASCII, no line too long: kept as it came
            return self._holding(
                Frame(None, None, nbytes, complete, count, parts), chunk[last_nl + 1 :]
            )
        lines = _decode(complete).split("\n")
        # A line of n characters has at most 4n bytes: only a long one needs a byte count.
        if size <= limit or max(map(len, lines)) * 4 <= limit or _fits(lines, limit):
            return self._holding(Frame(lines, None, nbytes), chunk[last_nl + 1 :])
        return self._feed_general(pending + chunk if pending else chunk)

    @property
    def held(self) -> bytes:
        """The bytes held back: what :data:`CODEC.read_lines` reads in behind."""
        return self._pending

    def take(self, text: bytes, rest: bytes | None, count: int) -> Frame | None:
        """What ``CODEC.read_lines(fd, self.held, ...)`` returned: the frame :meth:`feed` would
        make of the chunk it read.  ``count > 0``: ``text`` is scanned complete lines, ``rest``
        what follows the last; else ``text`` is the held bytes and the chunk, framed here."""
        if count <= 0:
            self._pending = b""
            return self.feed(text)
        return self._holding(Frame(None, None, len(text) + 1, text, count), rest or b"")

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
        return self._holding(Frame(lines, flags, consumed) if lines else None, buf[start:])

    def _holding(self, frame: Frame | None, held: bytes) -> Frame | None:
        """``frame``, with ``held`` kept back for the next chunk; held bytes past the bound
        are cut into ``partial`` pieces first, which follow the frame."""
        self._pending = held
        if len(held) > self.max_line_bytes:
            return _merge(frame, self._cut_pending())
        return frame

    def _cut_overlong(self, data: bytes) -> tuple[list[str], bytes]:
        """Cut ``data`` into pieces of at most ``max_line_bytes`` (at character boundaries) until the rest fits."""
        limit = self.max_line_bytes
        pieces: list[str] = []
        while len(data) > limit:
            cut = _utf8_cut(data, limit)
            pieces.append(_decode(data[:cut]))
            data = data[cut:]
        return pieces, data

    def _append_line(
        self,
        data: bytes,
        term: bytes,
        lines: list[str],
        flags: list[tuple[bool, str | None]],
    ) -> None:
        pieces, rest = self._cut_overlong(data)
        lines.extend(pieces)
        flags.extend([(True, None)] * len(pieces))
        lines.append(_decode(rest))
        flags.append((False, None if term == b"\n" else term.decode("ascii")))

    def _cut_pending(self) -> Frame | None:
        """Cut the held-back bytes into ``partial`` pieces until less than a line's worth is left."""
        pieces, rest = self._cut_overlong(self._pending)
        consumed = len(self._pending) - len(rest)
        self._pending = rest
        if not pieces:
            return None
        return Frame(pieces, [(True, None)] * len(pieces), consumed)

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
