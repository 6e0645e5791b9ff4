"""The compiled code of the dataclasses' generated methods, kept between starts.

``@dataclass`` writes each class's ``__init__``, ``__repr__``, ``__eq__``, ``__hash__`` and, when
frozen, ``__setattr__``/``__delattr__`` as source text and compiles it with ``exec``: six
compilations a class.  The daemon makes ~160 such classes at start-up, and compiling their
methods was about half of its imports (185 -> 95 ms on the 2-core box; issue 53: the start
is most of a short flood's CPU).  The text of a method depends only on its class's fields, so
its code object can be kept, like a ``.pyc``: :func:`install` gives the ``dataclasses`` module
an ``exec`` that looks the text up first and compiles only what it has not seen, and the
process saves what it compiled when it exits.

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
from pathlib import Path
from types import CodeType
from typing import Any, Final

_FORMAT: Final = 1
_MAX_ENTRIES: Final = 4096  # past this, a save keeps only what this process used
_CACHE_DIR: Final = Path(__file__).resolve().parent / "__pycache__"


class CodeCache:
    """Source text -> code object, loaded from and saved to one file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.codes: dict[str, CodeType] = {}
        self.used: set[str] = set()
        self.compiled = 0  # texts compiled by this process (not found in the file)
        self.load()

    def load(self) -> None:
        try:
            with open(self.path, "rb") as fh:
                st = os.fstat(fh.fileno())
                if st.st_uid != os.geteuid() or st.st_mode & 0o022:
                    return  # another user's, or writable by others: not run
                kept = marshal.load(fh)
        except (OSError, EOFError, ValueError, TypeError):
            return
        if (
            isinstance(kept, tuple)
            and len(kept) == 3
            and kept[0] == _FORMAT
            and kept[1] == sys.implementation.cache_tag
            and isinstance(kept[2], dict)
        ):
            self.codes = {
                text: code
                for text, code in kept[2].items()
                if isinstance(text, str) and isinstance(code, CodeType)
            }

    def exec(
        self, source: Any, globals: dict[str, Any] | None = None, locals: Any = None, /
    ) -> None:
        """``exec`` as dataclasses calls it, a source text compiled once across starts."""
        if isinstance(source, str):
            code = self.codes.get(source)
            if code is None:
                code = compile(source, "<string>", "exec")
                self.codes[source] = code
                self.compiled += 1
            self.used.add(source)
            source = code
        builtins.exec(source, globals, locals)

    def save(self) -> None:
        """What this process compiled, written for the next start (atomically; never raises)."""
        if not self.compiled or sys.dont_write_bytecode:
            return
        codes = self.codes
        if len(codes) > _MAX_ENTRIES:
            codes = {text: code for text, code in codes.items() if text in self.used}
        temporary = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(exist_ok=True)
            with open(temporary, "wb") as fh:
                marshal.dump((_FORMAT, sys.implementation.cache_tag, codes), fh)
            os.chmod(temporary, 0o644)
            os.replace(temporary, self.path)
        except (OSError, ValueError):
            try:
                temporary.unlink()
            except OSError:
                pass


def _compiles_by_name() -> bool:
    """The dataclasses module calls ``exec`` by its name (its functions', or its helper
    classes' methods': 3.13 builds methods in a class of its own)."""
    values = list(vars(dataclasses).values())
    values += [attr for value in values if isinstance(value, type) for attr in vars(value).values()]
    return any("exec" in getattr(getattr(v, "__code__", None), "co_names", ()) for v in values)


def install(path: Path | None = None) -> CodeCache | None:
    """Route the ``dataclasses`` module's ``exec`` through a cache (saved at exit); None where
    that module does not compile through ``exec`` by name, or ``DFLASHD_NO_CODE_CACHE=1``
    (then nothing is changed)."""
    if os.environ.get("DFLASHD_NO_CODE_CACHE") == "1" or not _compiles_by_name():
        return None  # a dataclasses that compiles otherwise: leave it be
    cache = CodeCache(path or _CACHE_DIR / f"dataclass-code.{sys.implementation.cache_tag}.bin")
    dataclasses.exec = cache.exec  # type: ignore[attr-defined]  # found before the builtin
    atexit.register(cache.save)
    return cache
