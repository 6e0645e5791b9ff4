"""What waiting on a pipe with poll(2) costs the job that writes into it (issue 53).

Linux (5.16 on) marks a pipe that was ever polled (``pipe->poll_usage``) and from then on wakes
its readers' queue on every write(2), whether or not anyone waits there.  A job printing line by
line pays it on every line.  Here a child writes ``--mib`` of 113-byte lines, one write(2)
each, into a 1 MiB pipe that one reader drains lazily (512 KiB reads, a millisecond's pause
after a small one, as dflashd's drain gathers); the three readers differ only in how they wait
once the pipe is empty:

    block   a blocking read(2) (never empty-handed: the ceiling)
    poll    poll(2), then a non-blocking read (dflashd's drain before this change)
    tee     ``CODEC.wait_bytes``: a blocking tee(2) of one byte into a bell pipe (the drain now)

Rounds alternate the order; printed: each reader's median MiB/s (the child's own clock) and its
round-by-round ratio to ``block``.

    python tests/perf/poll_cost.py [--mib 64] [--rounds 8]
"""

from __future__ import annotations

import argparse
import os
import select
import statistics
import subprocess
import sys
import time

from dflashd.logs.drain import PIPE_BYTES, READ_BYTES, SMALL_READ_BYTES, grow_pipe
from dflashd.logs.linecodec import CODEC

CHILD = r"""
import os, sys, time
n = int(sys.argv[1])
line = b"step 000000001 loss 1.234 tok/s 51,200 lr 3e-4 " + b"x" * 64 + b"\n"
write = os.write
start = time.perf_counter()
for _ in range(n):
    write(1, line)
took = time.perf_counter() - start
os.write(2, f"{n * len(line) / took / 2**20:.3f}\n".encode())
"""
LINE_BYTES = 113
READERS = ("block", "poll", "tee")


def one_run(reader: str, mib: float) -> float:
    """The child's MiB/s with this reader."""
    read_fd, write_fd = os.pipe()
    report_r, report_w = os.pipe()
    grow_pipe(read_fd, PIPE_BYTES)
    lines = int(mib * 2**20 // LINE_BYTES)
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(lines)], stdout=write_fd, stderr=report_w
    )
    os.close(write_fd)
    os.close(report_w)
    bell = os.pipe()
    os.set_blocking(bell[0], False)
    poller = select.poll()
    poller.register(read_fd, select.POLLIN)
    if reader != "block":
        os.set_blocking(read_fd, False)
    try:
        while True:
            try:
                data = os.read(read_fd, READ_BYTES)
            except BlockingIOError:
                if reader == "poll":
                    poller.poll()
                else:
                    assert CODEC.wait_bytes is not None
                    CODEC.wait_bytes(read_fd, *bell)
                continue
            if not data:
                break
            if len(data) < SMALL_READ_BYTES:
                time.sleep(0.001)  # the drain's gather: the pace it reads a line flood at
        child.wait()
        return float(os.read(report_r, 64))
    finally:
        for fd in (read_fd, report_r, *bell):
            os.close(fd)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=float, default=64)
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    if CODEC.wait_bytes is None:
        print("the C loops were not built here: no tee reader to measure", file=sys.stderr)
        return 2
    rates: dict[str, list[float]] = {reader: [] for reader in READERS}
    for number in range(args.rounds):
        for reader in READERS if number % 2 == 0 else READERS[::-1]:
            rates[reader].append(one_run(reader, args.mib))
    print(f"# {os.uname().release}, {args.mib:g} MiB of lines, {args.rounds} rounds")
    for reader in READERS:
        paired = [a / b for a, b in zip(rates[reader], rates["block"], strict=True)]
        print(
            f"{reader:6} {statistics.median(rates[reader]):7.1f} MiB/s   "
            f"x block {statistics.median(paired):.3f}   each {[round(r) for r in rates[reader]]}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
