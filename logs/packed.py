"""Compressed rotated files: their names, and reading them as far as they are intact.

A rotated file is compressed by a helper process (logs/squeeze.py) into ``base.N.zst``
(zstd, through the ``zstandard`` binding) or, where that binding is missing, ``base.N.gz``;
files from older versions are ``.gz``.  Both are read here, each as far as it is intact: a
truncated or foreign file ends early and the damage is said once on stderr, instead of an
exception that would blind every reader of the set.
"""

from __future__ import annotations

import gzip
import importlib.util
import sys
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO, Final, cast

GZ_SUFFIX: Final = ".gz"
ZST_SUFFIX: Final = ".zst"
PACKED_SUFFIXES: Final = (ZST_SUFFIX, GZ_SUFFIX)
_GZ_ERRORS: Final = (EOFError, OSError, zlib.error)  # truncated, not gzip at all, corrupt


def zstd_home() -> str | None:
    """The folder holding the ``zstandard`` binding, found without importing it (the daemon
    stays small; the compression helper loads it), or None where it is not installed."""
    try:
        spec = importlib.util.find_spec("zstandard")
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    return str(Path(spec.origin).parent.parent)


def packed_suffix(name: str) -> str:
    """``.zst``, ``.gz`` or ``""``."""
    return next((s for s in PACKED_SUFFIXES if name.endswith(s)), "")


def unpacked_name(name: str) -> str:
    """``base.3`` for ``base.3``, ``base.3.zst`` and ``base.3.gz``."""
    suffix = packed_suffix(name)
    return name[: -len(suffix)] if suffix else name


def _say_on_stderr(message: str) -> None:
    print(f"dflashd: {message}", file=sys.stderr, flush=True)


# Readers show everything intact and say what they skipped: once per problem, on stderr.
skipped_hook: Callable[[str], None] = _say_on_stderr
_said: set[str] = set()


def say_skipped(message: str) -> None:
    """Report one unreadable part of the log set (once per process)."""
    if message not in _said:
        _said.add(message)
        skipped_hook(message)


class TolerantGzipFile(gzip.GzipFile):
    """A rotated ``.gz`` read as far as it is intact: a truncated or foreign file ends early.

    Every line before the damage is read; then reading stops and the damage is reported
    (``say_skipped``), instead of an exception that would blind every reader of the set.
    """

    damaged: str | None = None

    def _damage(self, exc: BaseException) -> bytes:
        if self.damaged is None:
            self.damaged = f"{type(exc).__name__}: {exc}"
            say_skipped(f"{self.name}: damaged ({self.damaged}); read up to the damage")
        return b""

    def read(self, size: int | None = -1) -> bytes:
        if self.damaged is not None:
            return b""
        try:
            return super().read(size)
        except _GZ_ERRORS as exc:
            return self._damage(exc)

    def read1(self, size: int = -1) -> bytes:
        if self.damaged is not None:
            return b""
        try:
            return super().read1(size)
        except _GZ_ERRORS as exc:
            return self._damage(exc)

    def readline(self, size: int | None = -1) -> bytes:
        if self.damaged is not None:
            return b""
        try:
            return super().readline(-1 if size is None else size)
        except _GZ_ERRORS as exc:
            return self._damage(exc)

    def seek(self, offset: int, whence: int = 0) -> int:
        if offset == 0 and whence == 0:
            self.damaged = None  # from the start again: the damage is met (and said) again
        try:
            return super().seek(offset, whence)
        except _GZ_ERRORS as exc:
            self._damage(exc)
            return 0

    def read_all(self) -> bytes:
        """Everything up to the damage, in blocks (a single read would lose the intact part)."""
        parts = []
        while block := self.read(1 << 20):
            parts.append(block)
        return b"".join(parts)


class TolerantZstdFile:
    """A rotated ``.zst`` read as far as it is intact (the same contract as the gzip one)."""

    def __init__(self, path: Path) -> None:
        self.name = str(path)
        self.damaged: str | None = None
        self._raw = open(path, "rb")
        self._buffer = b""
        self._open_stream()

    def _open_stream(self) -> None:
        import zstandard

        self._zstd = zstandard
        self._raw.seek(0)
        self._dobj = zstandard.ZstdDecompressor().decompressobj()
        self._in_frame = False  # bytes of a frame fed, its end not yet seen
        self._done = False
        self._buffer = b""

    def _damage(self, exc: BaseException) -> bytes:
        if self.damaged is None:
            self.damaged = f"{type(exc).__name__}: {exc}"
            say_skipped(f"{self.name}: damaged ({self.damaged}); read up to the damage")
        return b""

    def _decompress(self, chunk: bytes) -> bytes:
        out = b""
        while chunk:
            data: bytes = self._dobj.decompress(chunk)
            out += data
            self._in_frame = not self._dobj.eof
            if not self._dobj.eof:
                break
            chunk = self._dobj.unused_data  # the next frame, if any
            self._dobj = self._zstd.ZstdDecompressor().decompressobj()
        return out

    def _fill(self, size: int) -> bytes:
        """The next decompressed block ("" at the end, or past damage, said once)."""
        while self.damaged is None and not self._done:
            try:
                chunk = self._raw.read(max(size, 1 << 16))
                if not chunk:
                    self._done = True
                    if self._in_frame:
                        return self._damage(EOFError("the file ends inside a zstd frame"))
                    return b""
                out = self._decompress(chunk)
            except (self._zstd.ZstdError, OSError) as exc:
                return self._damage(exc)
            if out:
                return out
        return b""

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            out, self._buffer = self._buffer + read_all_blocks(lambda: self._fill(1 << 20)), b""
            return out
        while len(self._buffer) < size:
            block = self._fill(max(size - len(self._buffer), 1 << 16))
            if not block:
                break
            self._buffer += block
        out, self._buffer = self._buffer[:size], self._buffer[size:]
        return out

    def readline(self, size: int | None = -1) -> bytes:
        while b"\n" not in self._buffer:
            block = self._fill(1 << 16)
            if not block:
                break
            self._buffer += block
        cut = self._buffer.find(b"\n") + 1 or len(self._buffer)
        out, self._buffer = self._buffer[:cut], self._buffer[cut:]
        return out

    def __iter__(self) -> Iterator[bytes]:
        while line := self.readline():
            yield line

    def seek(self, offset: int, whence: int = 0) -> int:
        if offset != 0 or whence != 0:
            raise OSError("a compressed log file is read from its start only")
        self.damaged = None
        self._open_stream()
        return 0

    def fileno(self) -> int:
        return self._raw.fileno()

    def close(self) -> None:
        self._raw.close()

    def __enter__(self) -> TolerantZstdFile:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def read_all_blocks(read: Callable[[], bytes]) -> bytes:
    parts = []
    while block := read():
        parts.append(block)
    return b"".join(parts)


def read_all(fh: Any) -> bytes:
    """Everything up to the damage, in blocks (a single read would lose the intact part)."""
    return read_all_blocks(lambda: cast(bytes, fh.read(1 << 20)))


def open_log_file(path: Path) -> BinaryIO:
    """A log file for reading: a compressed rotated one is decompressed as it is read."""
    if path.name.endswith(ZST_SUFFIX):
        return cast(BinaryIO, TolerantZstdFile(path))
    if path.name.endswith(GZ_SUFFIX):
        return cast(BinaryIO, TolerantGzipFile(filename=str(path), mode="rb"))
    return open(path, "rb")


def is_packed(fh: object) -> bool:
    """A compressed file (read forwards only)."""
    return isinstance(fh, TolerantGzipFile | TolerantZstdFile | gzip.GzipFile)


def last_line_packed(path: Path) -> bytes | None:
    """The last complete line of a compressed rotated file (decompressed as a stream)."""
    last: bytes | None = None
    try:
        with cast(Any, open_log_file(path)) as fh:
            for raw in fh:
                if raw.endswith(b"\n"):
                    last = raw
    except (OSError, EOFError, zlib.error):
        return last
    return last
