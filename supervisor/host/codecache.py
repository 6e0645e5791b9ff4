"""The compiled code of the dataclasses' generated methods, kept between starts.

``@dataclass`` writes each class's ``__init__``, ``__repr__``, ``__eq__``, ``__hash__`` and, when
frozen, ``__setattr__``/``__delattr__`` as source text and compiles it with ``exec``: six
compilations a class.  The daemon makes ~160 such classes at start-up, and compiling their
methods was about a third of its imports (154 -> 97 ms on the 2-core box; issue 53: the start
is most of a short flood's CPU).  The text of a method depends only on its class's fields, so
its code object can be kept, like a ``.pyc``: :func:`install` gives the ``dataclasses`` module
an ``exec`` that looks the text up first and compiles only what it has not seen; the daemon
saves what it compiled once its start-up is over (:func:`settle`), a client when it exits.

Kept by the exact source text, an entry can never be wrong for a class that changed: a changed
class has other text, which is compiled afresh.  The file lives with the package's own
bytecode (``__pycache__``), is read only when it belongs to this user and no one else may write
to it (what it holds runs, as a ``.pyc`` does), and is written atomically, never where Python
would not write bytecode (``PYTHONDONTWRITEBYTECODE``).  Anything amiss (no file, a torn or
foreign one, a read-only package) is the plain ``exec``: slower, never different.
"""

from __future__ import annotations

import atexit
import builtins
import dataclasses
import marshal
import os
import sys
import zlib
from pathlib import Path
from types import CodeType
from typing import Any, Final

_FORMAT: Final = 3
_MAX_ENTRIES: Final = 4096  # past this, a save keeps only what this process used
_CACHE_DIR: Final = Path(__file__).resolve().parent / "__pycache__"
_installed: CodeCache | None = None

# The file: the header's length (8 bytes, little-endian), the header (marshal: the format, the
# interpreter's cache tag and the index), then the blob.  An entry of the index is an offset in
# the blob of its text's UTF-8, that text's length, and the offset and length of its marshalled
# code; the index finds entries by the CRC-32 of their text, and the text itself is compared
# before its code is taken.
Entry = tuple[int, int, int, int]
Piece = tuple[bytes | memoryview, bytes | memoryview]  # a text and its code, to be written


class CodeCache:
    """Source text -> code object, from one file read at start and written once after it.

    A code is unmarshalled only when its text is met, and the file is one buffer, let go at
    once (unmarshalling every entry up front left ~1.5 MiB of small objects the daemon kept).
    A save merges into the file as it is then (another process may have written it since) and
    writes the pieces one by one: building the new file in memory first cost a saving daemon
    ~9 MiB at its start (its peak RSS in CI's flood 36 -> 45 MiB)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.index: dict[int, list[Entry]] = {}
        self.blob = memoryview(b"")
        self.used: list[Entry] = []  # entries of the file met by this process
        self.new: dict[str, CodeType] = {}  # compiled by this process
        self.loaded = False  # read at the first class made, not at install (see install)

    @property
    def compiled(self) -> int:
        """Texts compiled by this process (not found in the file)."""
        return len(self.new)

    def load(self) -> None:
        self.loaded = True
        try:
            with open(self.path, "rb") as fh:
                st = os.fstat(fh.fileno())
                if st.st_uid != os.geteuid() or st.st_mode & 0o022:
                    return  # another user's, or writable by others: not run
                data = memoryview(fh.read())
            header_n = int.from_bytes(data[:8], "little")
            header = marshal.loads(data[8 : 8 + header_n])
        except (OSError, EOFError, ValueError, TypeError):
            return
        if (
            isinstance(header, tuple)
            and len(header) == 3
            and header[:2] == (_FORMAT, sys.implementation.cache_tag)
            and isinstance(header[2], dict)
        ):
            self.index, self.blob = header[2], data[8 + header_n :]

    def _entries(self, text: bytes) -> list[Entry]:
        """The file's entries whose text is ``text``."""
        found: list[Entry] = []
        entries = self.index.get(zlib.crc32(text))
        for entry in entries if isinstance(entries, list) else ():
            if self._whole(entry):
                at, text_n = entry[0], entry[1]
                if text_n == len(text) and self.blob[at : at + text_n] == text:
                    found.append(entry)
        return found

    def _kept(self, text: bytes) -> CodeType | None:
        """The text's code from the file, or None (not there, or an entry not as written:
        whatever the file holds, a class is made, by compiling)."""
        try:
            for entry in self._entries(text):
                code = marshal.loads(self.blob[entry[2] : entry[2] + entry[3]])
                if isinstance(code, CodeType):
                    self.used.append(entry)
                    return code
        except Exception:  # a malformed entry: compiled instead
            return None
        return None

    def exec(
        self, source: Any, globals: dict[str, Any] | None = None, locals: Any = None, /
    ) -> None:
        """``exec`` as dataclasses calls it, a source text compiled once across starts."""
        if isinstance(source, str):
            if not self.loaded:
                self.load()
            code = self.new.get(source) or self._kept(source.encode())
            if code is None:
                code = self.new[source] = compile(source, "<string>", "exec")
            source = code
        builtins.exec(source, globals, locals)

    def save(self) -> None:
        """What this process compiled, merged into the file (atomically; never raises)."""
        if not self.new or sys.dont_write_bytecode:
            return
        try:
            self._write()
        except Exception:  # a malformed file read, a full disk: the next start compiles again
            pass

    def _pieces(self, entries: list[Entry]) -> list[Piece]:
        blob = self.blob
        return [(blob[e[0] : e[0] + e[1]], blob[e[2] : e[2] + e[3]]) for e in entries]

    def _write(self) -> None:
        disk = CodeCache(self.path)  # the file as it is now
        disk.load()
        encoded = ((text.encode(), code) for text, code in self.new.items())
        ours = [(text, code) for text, code in encoded if not disk._entries(text)]
        if not ours:
            return  # another process has written them meanwhile
        pieces: list[Piece] = [(text, marshal.dumps(code)) for text, code in ours]
        whole = [e for entries in disk.index.values() if isinstance(entries, list) for e in entries]
        kept = [e for e in whole if disk._whole(e)]
        if len(kept) + len(pieces) > _MAX_ENTRIES:
            pieces += self._pieces([e for e in self.used if self._whole(e)])
        else:
            pieces += disk._pieces(kept)
        index: dict[int, list[Entry]] = {}
        offset = 0
        for text, code in pieces:
            index.setdefault(zlib.crc32(text), []).append(
                (offset, len(text), offset + len(text), len(code))
            )
            offset += len(text) + len(code)
        header = marshal.dumps((_FORMAT, sys.implementation.cache_tag, index))
        temporary = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(exist_ok=True)
            with open(temporary, "wb") as fh:
                fh.write(len(header).to_bytes(8, "little"))
                fh.write(header)
                for text, code in pieces:
                    fh.write(text)
                    fh.write(code)
            os.chmod(temporary, 0o644)
            os.replace(temporary, self.path)
        except OSError:
            try:
                temporary.unlink()
            except OSError:
                pass

    def _whole(self, entry: object) -> bool:
        """An entry of the file as this module writes them: four offsets within the blob."""
        if not (isinstance(entry, tuple) and len(entry) == 4):
            return False
        at, text_n, code_at, code_n = entry
        return all(isinstance(v, int) and v >= 0 for v in entry) and max(
            at + text_n, code_at + code_n
        ) <= len(self.blob)

    def release(self) -> None:
        self.index, self.blob, self.used, self.new = {}, memoryview(b""), [], {}


def install(path: Path | None = None) -> CodeCache | None:
    """Route the ``dataclasses`` module's ``exec`` through a cache (saved at exit); None with
    ``DFLASHD_NO_CODE_CACHE=1`` (then nothing is changed).  A ``dataclasses`` that does not
    compile through ``exec`` by name never calls it: the cache then stays unused.

    Called by the programs only, before they load the modules that make their classes: the
    ``dflashd`` command right after its Ctrl-C handler (``__main__``), the daemon program from
    the package's ``__init__``.  It reads nothing here (the file at the first class made), and
    a second call is the first's cache."""
    if os.environ.get("DFLASHD_NO_CODE_CACHE") == "1":
        return None
    global _installed
    if _installed is not None and path is None:
        return _installed
    cache = CodeCache(path or _CACHE_DIR / f"dataclass-code.{sys.implementation.cache_tag}.bin")
    dataclasses.exec = cache.exec  # type: ignore[attr-defined]  # found before the builtin
    atexit.register(cache.save)
    _installed = cache
    return cache


def settle() -> None:
    """Start-up is over (the daemon, before its loop): save what it compiled now, then let the
    texts and codes go and ``dataclasses`` compile as it always does.  A long-lived daemon kept
    them otherwise, ~1.7 MiB (issue 53: peak RSS 32.4 -> 34.1 MiB in a line flood)."""
    global _installed
    cache, _installed = _installed, None
    if cache is None:
        return
    cache.save()
    atexit.unregister(cache.save)
    if dataclasses.__dict__.get("exec") == cache.exec:
        del dataclasses.exec  # type: ignore[attr-defined]
    cache.release()
