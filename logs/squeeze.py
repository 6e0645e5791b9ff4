"""The compression helper: one rotated file, compressed in a process of its own, at the lowest
CPU and I/O priority, so the daemon pays nothing for it (neither its CPU nor its GIL).

    python -m dflashd.logs.squeeze CODEC PARENT_PID FD=OUT [FD=OUT ...]

Reads each inherited descriptor ``FD`` (a rotated file, whatever it is named by now) and
writes ``OUT`` with ``CODEC`` (``zstd``: level 3; ``gzip``: level 6); a burst of rotations
is one helper, not one each.  It dies with the
daemon (``PR_SET_PDEATHSIG``): a daemon never waits for it at exit; the file stays plain,
is read as such, and the next daemon compresses it.
"""

from __future__ import annotations

import ctypes
import gzip
import os
import shutil
import signal
import sys
from typing import BinaryIO, Final

ZSTD_LEVEL: Final = 1  # ~28x on run logs at ~1-2 CPU s per GiB here (gzip -6: 22x, 9 s)
GZIP_LEVEL: Final = 6
_PR_SET_PDEATHSIG: Final = 1
_IOPRIO_WHO_PROCESS: Final = 1
_IOPRIO_CLASS_IDLE: Final = 3
_SYS_IOPRIO_SET: Final = 251  # x86_64; elsewhere the call fails harmlessly


def lowest_priority(parent: int) -> None:
    """Nice 19, the idle I/O class, and death with the parent."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        sys.exit(1)  # the daemon died before the line above took effect
    try:
        os.setpriority(os.PRIO_PROCESS, 0, 19)
    except OSError:
        pass
    libc.syscall(_SYS_IOPRIO_SET, _IOPRIO_WHO_PROCESS, 0, _IOPRIO_CLASS_IDLE << 13)


def squeeze(src: BinaryIO, dst: BinaryIO, codec: str) -> None:
    """``src`` from its start into ``dst``."""
    src.seek(0)
    if codec == "zstd":
        import zstandard

        zstandard.ZstdCompressor(level=ZSTD_LEVEL).copy_stream(src, dst, read_size=1 << 20)
        return
    with gzip.GzipFile(
        filename="", mode="wb", fileobj=dst, compresslevel=GZIP_LEVEL, mtime=0
    ) as out:
        shutil.copyfileobj(src, out, 1 << 20)


def main(argv: list[str]) -> int:
    codec, parent, jobs = argv[0], int(argv[1]), argv[2:]
    lowest_priority(parent)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    failed = 0
    for job in jobs:
        fd_text, _, out = job.partition("=")
        part = out + ".part"  # OUT appears only whole: a killed helper leaves a .part, never OUT
        try:
            with (
                os.fdopen(int(fd_text), "rb") as src,
                os.fdopen(os.open(part, flags, 0o640), "wb") as dst,
            ):
                squeeze(src, dst, codec)
            os.replace(part, out)
        except OSError:
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
