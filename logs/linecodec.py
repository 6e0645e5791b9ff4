"""The log path's inner loops: scanning a chunk's complete lines, encoding their records.

    scan(data, max_line)                      -> lines in ``data``, or -1
    encode(data, count, head, seq0, mid, tail) -> bytes
    prefix(data, count, head)                  -> bytes
    mentions(data, words)                      -> bool
    read_lines(fd, held, max_read, max_line)   -> (text, rest, nread, count)   (C only)
    pending(fd)                                -> bytes waiting in a pipe     (C only)
    wait_bytes(fd, bell_r, bell_w)             -> 1 once the pipe has bytes   (C only)
    append_records(fd, dir_fd, name, dev, ino, frames, tail) -> (written, total, err)  (C only)
    EchoWriter(fd, max_bytes, max_items, note_head, note_tail)  the echo's thread   (C only)

``data`` is complete lines joined by ``\\n`` (no trailing one).  ``CODEC.scan`` counts them when
every byte is printable ASCII that a JSON string holds verbatim (0x20 to 0x7f except ``"``
and ``\\``) and no line is longer than ``max_line`` bytes, else -1: the framer's fast path.
:func:`encode` writes ``head + seq + mid + line + tail`` per line, ``seq`` counting up
from ``seq0``: the records of such a frame.  ``CODEC.prefix`` writes ``head + line + "\\n"`` per
line: the echo's ``r3 out | `` lines.  ``CODEC.mentions`` says whether one of ``words`` occurs in
``data``: the line watcher's questions of a frame (a loss? an epoch? a NaN?), which a flood
asks of every 256 KiB frame it matches (CPython's search took 0.2 ms a word there).
``CODEC.read_lines`` is the drain's read and the scan in one call without the GIL, the read
landing behind the held-back bytes (``_lines.c`` says what it returns); it has no Python twin:
where C was not built it is None and the drain reads with ``os.read`` and frames with
:meth:`~dflashd.logs.framer.LineFramer.feed`, which makes the same frames.
``CODEC.wait_bytes`` is the drain's wait on its emptied pipe without ``poll(2)``, which would
make every later write of the job's dearer (``_lines.c`` says why); None where C was not built
(the drain then polls).
``CODEC.append_records`` is the writer's append of scanned frames (the live file's name
checked, the records encoded and written) in one such call; where C was not built it is None
and the writer checks, encodes and writes in three (:meth:`~dflashd.logs.livefile.LiveFile.append`).
``CODEC.echo_writer`` is the echo's writer thread, which prefixes and writes the frames it is
offered without ever taking the GIL; None where C was not built (the echo is then a Python
thread: :class:`~dflashd.supervisor.speak.echo.EchoThread`).

Each exists twice: in C (``logs/_lines.c``, built by ``pip install`` where a compiler is,
run without the GIL on large inputs) and here in Python (the reference, and the fallback).
:data:`CODEC` holds the pair in use (``CODEC.implementation``: ``"c"`` or ``"python"``);
``DFLASHD_PURE_PYTHON=1`` forces Python.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from types import ModuleType
from typing import Final, Protocol

import orjson

# Bytes a JSON string cannot hold verbatim (besides non-ASCII, checked with isascii()).
_UNSAFE: Final = bytes([0x22, 0x5C, *(b for b in range(0x20) if b != 0x0A)])


def split_python(data: bytes, max_line: int) -> list[bytes] | None:
    """The Python scan, keeping what it found: the lines, or None where ``CODEC.scan`` says -1.

    The framer keeps the lines with the frame, so the Python encoder does not split again.
    """
    if not data.isascii() or len(data.translate(None, _UNSAFE)) != len(data):
        return None
    parts = data.split(b"\n")
    if len(data) > max_line and max(map(len, parts)) > max_line:
        return None
    return parts


def scan_python(data: bytes, max_line: int) -> int:
    """The reference ``CODEC.scan``."""
    parts = split_python(data, max_line)
    return -1 if parts is None else len(parts)


def encode_python(
    data: bytes, count: int, head: bytes, seq0: int, mid: bytes, tail: bytes
) -> bytes:
    """The reference :func:`encode`."""
    parts = data.split(b"\n")
    if len(parts) != count:
        raise ValueError("data does not hold count lines")
    return encode_parts(parts, head, seq0, mid, tail)


def encode_parts(parts: list[bytes], head: bytes, seq0: int, mid: bytes, tail: bytes) -> bytes:
    """:func:`encode` over lines already split: C-level slice assignments, no Python per line."""
    count = len(parts)
    if count < 1:
        raise ValueError("data does not hold count lines")
    seqs = orjson.dumps(list(range(seq0, seq0 + count)))[1:-1].split(b",")
    pieces: list[bytes] = [b""] * (4 * count)
    pieces[0::4] = seqs
    pieces[1::4] = [mid] * count
    pieces[2::4] = parts
    pieces[3::4] = [tail + head] * count
    pieces[-1] = tail
    return head + b"".join(pieces)


def prefix_python(data: bytes, count: int, head: bytes) -> bytes:
    """The reference ``CODEC.prefix``."""
    if count < 1 or data.count(b"\n") != count - 1:
        raise ValueError("data does not hold count lines")
    return head + data.replace(b"\n", b"\n" + head) + b"\n"


Scan = Callable[[bytes, int], int]
Encode = Callable[[bytes, int, bytes, int, bytes, bytes], bytes]
Split = Callable[[bytes, int], list[bytes] | None]
Prefix = Callable[[bytes, int, bytes], bytes]
Mentions = Callable[[bytes, tuple[bytes, ...]], bool]
ReadLines = Callable[[int, bytes, int, int], tuple[bytes, bytes | None, int, int]]
Pending = Callable[[int], int]
WaitBytes = Callable[[int, int, int], int]
FrameRecords = tuple[
    bytes, int, bytes, int, bytes
]  # text, count, head, seq0, mid: as encode takes them
AppendRecords = Callable[
    [int, int, bytes, int, int, tuple[FrameRecords, ...], bytes], tuple[int, int, int]
]


class EchoWriter(Protocol):
    """The echo's writer thread: ``_lines.EchoWriter`` (C, ``_lines.c`` says what each does)
    and its Python twin (:class:`~dflashd.supervisor.speak.echo.EchoThread`)."""

    @property
    def dropped(self) -> int: ...
    @property
    def queued_bytes(self) -> int: ...
    def offer(self, data: bytes, count: int, head: bytes, lines: int, /) -> bool: ...
    def close(self, timeout_s: float, /) -> bool: ...


EchoWriterMaker = Callable[[int, int, int, bytes, bytes], EchoWriter]


def mentions_python(data: bytes, words: tuple[bytes, ...]) -> bool:
    """The reference ``CODEC.mentions``."""
    return any(word in data for word in words)


@dataclass(slots=True)
class Codec:
    """The pair in use (``CODEC``); a test may :func:`use` the other one."""

    implementation: str  # "c" or "python"
    scan: Scan
    encode: Encode
    prefix: Prefix
    mentions: Mentions
    split: Split | None = None  # Python: the scan that keeps the lines (the framer uses it)
    read_lines: ReadLines | None = None  # C: the drain's read and scan in one call
    pending: Pending | None = None  # C: a pipe's fill, asked without giving the GIL away
    wait_bytes: WaitBytes | None = None  # C: the drain's wait on its pipe, without poll(2)
    append_records: AppendRecords | None = None  # C: the writer's check, encode and write in one
    echo_writer: EchoWriterMaker | None = None  # C: the echo's thread, without the GIL


def _built() -> ModuleType | None:
    try:
        return importlib.import_module("dflashd.logs._lines")
    except ImportError:
        return None


def _codec(built: ModuleType | None) -> Codec:
    """The C loops where ``built``, else the Python ones."""
    if built is None:
        return Codec(
            "python", scan_python, encode_python, prefix_python, mentions_python, split_python
        )
    return Codec(
        "c",
        built.scan,
        built.encode,
        built.prefix,
        built.mentions,
        read_lines=built.read_lines,
        pending=built.pending,
        wait_bytes=built.wait_bytes,
        append_records=built.append_records,
        echo_writer=built.EchoWriter,
    )


def use(implementation: str) -> Codec:
    """Switch the pair in use to ``"c"`` or ``"python"``; returns the one it replaces."""
    built = _built() if implementation == "c" else None
    if implementation == "c" and built is None:
        raise RuntimeError("the C inner loops were not built here")
    previous = replace(CODEC)
    chosen = _codec(built)
    CODEC.implementation, CODEC.scan = chosen.implementation, chosen.scan
    CODEC.encode, CODEC.split = chosen.encode, chosen.split
    CODEC.prefix, CODEC.mentions = chosen.prefix, chosen.mentions
    CODEC.read_lines, CODEC.append_records = chosen.read_lines, chosen.append_records
    CODEC.pending, CODEC.wait_bytes = chosen.pending, chosen.wait_bytes
    CODEC.echo_writer = chosen.echo_writer
    return previous


def _default() -> Codec:
    return _codec(_built() if os.environ.get("DFLASHD_PURE_PYTHON") != "1" else None)


CODEC: Final = _default()
