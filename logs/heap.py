"""The C allocator under the log path: buffers kept for reuse during a flood, given back after.

A flood passes through buffers of 64 KiB to a few MiB: the drain's reads, the framer's copy of
a chunk's complete lines, a batch's records, the echo's prefixed lines.  glibc serves each of
those above its mmap threshold (128 KiB until it learns otherwise) with a fresh ``mmap`` that
``free`` unmaps, and trims the heap's top as soon as 128 KiB of it is free, so every such buffer
was new memory: a page fault and a page cleared for every 4 KiB of the job's output, in each of
the three threads (a third of the log writer's time in a 32 MiB block flood on the 2-core box,
``perf``; issue 53).  :func:`keep_freed_buffers` has the allocator keep them: buffers below
``MMAP_THRESHOLD`` come from the heap, and up to ``TRIM_THRESHOLD`` of free heap stays mapped,
so the next chunk reuses the last one's pages.  What stays is given back by
:func:`release_free_memory`, which the log sink calls once a burst is over
(:class:`~dflashd.logs.sink.LogSink`), so an idle daemon is as small as before.

It also bounds the allocator's arenas at ``ARENAS``.  glibc gives a thread that allocates
while another holds an arena an arena of its own (up to eight per CPU): a flood's buffers are
allocated by the drain threads and freed by the log writer's and the echo's, and each arena
kept its own freed buffers.  Two arenas share them (the main thread's and one for the rest),
so a buffer freed by one thread is the next one another allocates.  On the 2-core box (256 MiB
block floods, paired over 16 rounds) the rate moved 1.106 x, 1.018 x and 0.970 x in three
A/Bs, and the peak RSS within a MiB: no gain beyond that box's noise (docs/measurements.md).
Set before the log threads start (at the sink's start), the bound holds for every arena made
after it; the job's own allocator is not touched (an option of this process, no environment).

Elsewhere than glibc (musl, macOS) both are no-ops.
"""

from __future__ import annotations

import ctypes
from typing import Final

MMAP_THRESHOLD: Final = 4 * 1024 * 1024
TRIM_THRESHOLD: Final = 64 * 1024 * 1024
_M_TRIM_THRESHOLD: Final = -1  # glibc's mallopt parameters (malloc.h)
_M_MMAP_THRESHOLD: Final = -3
_M_ARENA_MAX: Final = -8
ARENAS: Final = 2

_kept = False


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None)
    except OSError:
        return None


def keep_freed_buffers() -> bool:
    """Have glibc keep freed buffers of up to ``MMAP_THRESHOLD`` for reuse, in at most
    ``ARENAS`` arenas (once per process); False where there is no ``mallopt``."""
    global _kept
    if _kept:
        return True
    libc = _libc()
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        return False
    mallopt(_M_ARENA_MAX, ARENAS)  # before any arena past it is made: see the module's text
    _kept = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
    return _kept


def release_free_memory() -> None:
    """glibc's ``malloc_trim(0)``: free heap memory returned to the system (elsewhere: nothing)."""
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is not None:
        trim(0)
