"""A job's line rate under dflashd beside a low-priority busy neighbour (issue 53): none, a
busy loop at nice 19, and one at the idle CPU policy (``SCHED_IDLE``), interleaved round by
round on the same bytes.

Why the compressor's helper runs at ``SCHED_IDLE`` (logs/compress.py): Linux counts a CPU that
runs only idle-policy work as idle when it places a waking thread, and one running nice-19 work
as busy, so beside a nice-19 neighbour the daemon's drains are woken on the job's own CPU and
take turns with it.  On a box with few CPUs that is the job's rate.

    python tests/perf/neighbour.py [--mib 128] [--rounds 5] [--variant dflashd-plain]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import side_by_side as sbs

BUSY_LOOP = [sys.executable, "-c", "while True: pass"]


def neighbour(kind: str) -> subprocess.Popen[bytes] | None:
    """The busy loop for ``kind`` (none, nice19, idle), started before the run."""
    if kind == "none":
        return None
    loop = subprocess.Popen(BUSY_LOOP)
    os.setpriority(os.PRIO_PROCESS, loop.pid, 19)
    if kind == "idle":
        os.sched_setscheduler(loop.pid, os.SCHED_IDLE, os.sched_param(0))
    return loop


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=float, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--variant", default="dflashd-plain", choices=sorted(sbs.DFLASHD_VARIANTS))
    args = parser.parse_args()
    got: dict[str, list[float]] = {"none": [], "nice19": [], "idle": []}
    lost: list[str] = []
    with tempfile.TemporaryDirectory(prefix="dflashd-neighbour-") as tmp:
        for _ in range(args.rounds):
            for kind, rates in got.items():
                loop = neighbour(kind)
                try:
                    done = sbs.run_one(args.variant, "line", args.mib, Path(tmp), Path())
                finally:
                    if loop is not None:  # ours, by pid
                        loop.kill()
                        loop.wait()
                rates.append(done.mib_s)
                if done.mismatch:
                    lost.append(f"{kind}: {done.mismatch}")
    print(f"## line, {args.mib:g} MiB, {args.rounds} rounds, {args.variant}, {os.cpu_count()} CPUs")
    base = statistics.median(got["none"])
    for kind, rates in got.items():
        median = statistics.median(rates)
        print(
            f"{kind:8s} {median:8.1f} MiB/s  {median / base:5.2f}x none   "
            f"each {[round(x) for x in rates]}"
        )
    for mismatch in lost:
        print(f"BYTES LOST {mismatch}")
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main())
