"""The log writer's longest write when a rotation removes the oldest file (issue 53).

A long run's rotations each remove the set's oldest file once ``backups`` are kept; ext4 frees
a file's blocks at its last close, ~55 ms for 100 MiB already written back, and that write
held the writer (and, behind its 4 MiB queue, the job's pipe).  Here the writer takes ~1 GB of
records in 100 MiB files with one backup, the older files written back meanwhile (``sync``
every 250 writes, as minutes of a run would), and prints the median and the five longest
``write_frame`` calls.

    python tests/perf/rotation_stall.py [--dir /var/tmp] [--writes 2500]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from dflashd.logs import Frame, RotatingLogWriter

LINES = [f"step {i:09d} loss 1.234 tok/s 51,200 lr 3e-4 " + "x" * 64 for i in range(2000)]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", default="/var/tmp", help="a directory on the disk to measure")
    parser.add_argument("--writes", type=int, default=2500)
    args = parser.parse_args()
    frame = Frame(LINES, None, sum(len(line) + 1 for line in LINES))
    took: list[float] = []
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        writer = RotatingLogWriter(Path(folder), max_bytes=100 << 20, backups=1)
        for number in range(args.writes):
            start = time.perf_counter()
            writer.write_frame(1, "stdout", frame)
            took.append(time.perf_counter() - start)
            if number % 250 == 0:
                os.sync()  # the older files written back, as minutes of a run would
        rotations = writer.stats().rotations
        writer.close()
    took.sort()
    print(
        f"{len(took)} writes, {rotations} rotations: median {statistics.median(took) * 1000:.2f}"
        f" ms, longest {[round(t * 1000, 1) for t in took[-5:]]} ms"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
