"""Files the client writes on a user's behalf (``report -o``): never through a link.

A file is written whole to a new temporary name in the target's directory (``O_CREAT |
O_EXCL | O_NOFOLLOW``, through the directory held open) and renamed into place, so the
final name's old entry is replaced, never written into: a planted symlink or hard link to
someone's file leaves that file untouched.  A final component that is a symlink owned by
another user is refused outright (the user asked for a file there, not for theirs); one of
the user's own links is followed to where it points, and that place gets the same care.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path
from typing import Final

_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_NEW_FLAGS: Final = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_MAX_LINKS: Final = 8


class UnsafeOutput(Exception):
    """The output cannot be written safely; the message says why (one line)."""


def write_output(path: Path, data: bytes) -> Path:
    """Write ``data`` as ``path`` (see the module); returns the file actually written."""
    target = path
    for _ in range(_MAX_LINKS):
        try:
            st = os.lstat(target)
        except FileNotFoundError:
            break
        except OSError as exc:
            raise UnsafeOutput(f"{target}: {exc.strerror}") from None
        if not stat.S_ISLNK(st.st_mode):
            if stat.S_ISDIR(st.st_mode):
                raise UnsafeOutput(f"{target} is a directory")
            break
        if st.st_uid != os.geteuid():
            raise UnsafeOutput(
                f"{target} is a symlink owned by uid {st.st_uid}, not by you: refusing to "
                "write through it (remove it, or write the report elsewhere with -o)"
            )
        pointed = Path(os.readlink(target))
        target = pointed if pointed.is_absolute() else target.parent / pointed
    else:
        raise UnsafeOutput(f"{path}: too many levels of symbolic links")
    try:
        folder = os.open(target.parent, _DIR_FLAGS)
    except OSError as exc:
        raise UnsafeOutput(f"cannot write {target}: {exc.strerror}") from None
    try:
        _replace_in(folder, target.name, data)
    except OSError as exc:
        raise UnsafeOutput(f"cannot write {target}: {exc.strerror}") from None
    finally:
        os.close(folder)
    return target


def _replace_in(folder: int, name: str, data: bytes) -> None:
    tmp = f".{name}.{os.urandom(6).hex()}.tmp"
    fd = os.open(tmp, _NEW_FLAGS, 0o666, dir_fd=folder)  # the umask decides, as for any file
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=folder)
        raise
