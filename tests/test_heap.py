"""A flood's buffers are reused, not mapped afresh (logs/heap.py, issue 53): a real child
floods a real pipe that a real drain frames into a real sink and log file, in an interpreter
of its own; the kernel counts that interpreter's page faults, with glibc's allocator as it
comes and as the sink sets it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dflashd.logs import heap

FLOOD = r"""
import os, resource, subprocess, sys
from dflashd.logs import sink as sink_module
from dflashd.logs.drain import PipeDrain
from dflashd.logs.sink import LogSink
from dflashd.logs.writer import RotatingLogWriter

if sys.argv[1] == "fresh":
    sink_module.keep_freed_buffers = lambda: False  # the allocator as glibc leaves it
writer = RotatingLogWriter(sys.argv[2], max_bytes=1 << 30)
sink = LogSink(writer)
job = ("import os\nline = b'step 000000001 loss 2.000 tok/s 51,200 ' + b'x' * 80 + b'\\n'\n"
       "import sys\nblock = line * 512\nfor _ in range(int(sys.argv[1])): os.write(1, block)\n")  # 60 KiB writes
read_fd, write_fd = os.pipe()
child = subprocess.Popen([sys.executable, "-c", job, sys.argv[3]], stdout=write_fd)
os.close(write_fd)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
drain = PipeDrain(read_fd, run=1, src="stdout", sink=sink)
assert drain.wait_eof(120) and child.wait(60) == 0
assert sink.flush(120)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
sink.close()
"""


def _faults(mode: str, home: Path, blocks: int = 1024) -> int:
    home.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", FLOOD, mode, str(home), str(blocks)],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(done.stdout)


def test_a_floods_buffers_are_reused_instead_of_faulted_in_afresh(tmp_path: Path) -> None:
    """240 MiB through the drain, the sink and the writer fault in about what they hold at
    once (the queue, the pipe, a write's records), not what went through: faulting buffers
    in afresh cost ~100 faults per MiB flooded (5,100-6,800 for 60 MiB with glibc's allocator
    as it comes, before the writer's records were encoded into a buffer freed in the same C
    call; glibc's own threshold now reuses those too: 1,700-3,100 faults for 240 MiB as it comes)."""
    if not heap.keep_freed_buffers():
        pytest.skip("no glibc mallopt here")
    kept = _faults("kept", tmp_path / "kept", blocks=4096)
    # measured: 1,300 faults for 240 MiB (~5 MiB of pages) kept
    assert kept < 4096, kept


def test_keeping_is_set_once_per_process() -> None:
    first = heap.keep_freed_buffers()
    assert heap.keep_freed_buffers() is first


ARENAS = r"""
import ctypes, os, sys, threading
from dflashd.logs import heap
if sys.argv[1] == "kept":
    heap.keep_freed_buffers()
barrier = threading.Barrier(6)

def churn() -> None:  # what a flood's threads do: large buffers made in one, freed in another
    barrier.wait()
    for _ in range(300):
        data = os.urandom(1) * (512 * 1024)
        del data

threads = [threading.Thread(target=churn) for _ in range(6)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
ctypes.CDLL(None).malloc_stats()  # per arena, on stderr
"""


def _arenas(mode: str) -> int:
    done = subprocess.run(
        [sys.executable, "-c", ARENAS, mode], capture_output=True, text=True, check=True
    )
    return sum(line.startswith("Arena ") for line in done.stderr.splitlines())


def test_the_daemons_threads_share_its_few_arenas() -> None:
    """Six threads making and freeing 512 KiB buffers at once: with the bound set (as the
    sink sets it) glibc makes at most ``ARENAS`` arenas, each keeping freed buffers that any
    thread reuses, where the allocator as it comes makes one per thread it finds contending."""
    if not heap.keep_freed_buffers():
        pytest.skip("no glibc mallopt here")
    assert _arenas("kept") <= heap.ARENAS
