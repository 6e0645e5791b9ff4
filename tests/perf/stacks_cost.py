"""Live stack dumps: how long a dump of 1, 2 and 8 processes takes, and how long each process
is paused (issue 25).

Each target is a Python process with a few threads; one of them ticks every millisecond and
records the longest gap it sees.  A pause of the process (py-spy stopping it to unwind, in
``--native`` mode) shows as a gap; the non-blocking default should show none beyond the
scheduler's noise, measured the same way with no dump.

    python tests/perf/stacks_cost.py [--reps 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _bench import daemon_argv  # noqa: F401  (sets up the import path for tests/)

from dflashd.supervisor.host.pyspy import dump_processes, find_py_spy
from dflashd.supervisor.model.stacks import Role

TARGET = r"""
import os, sys, threading, time
gap_file = sys.argv[1]
def busy():
    while True:
        sum(range(5000)); time.sleep(0.002)
def ticker():
    last, worst = time.monotonic(), 0.0
    while True:
        time.sleep(0.001)
        now = time.monotonic()
        worst = max(worst, now - last)
        last = now
        with open(gap_file, "w") as fh:
            fh.write(f"{worst}")
        try:
            os.unlink(gap_file + ".reset")
            worst = 0.0
        except FileNotFoundError:
            pass
threading.Thread(target=busy, name="busy", daemon=True).start()
threading.Thread(target=ticker, name="ticker", daemon=True).start()
while True:
    time.sleep(1)
"""


def worst_gap_ms(gap: Path) -> float:
    try:
        return float(gap.read_text() or 0) * 1000
    except (OSError, ValueError):
        return float("nan")


def reset(gaps: list[Path]) -> None:
    for gap in gaps:
        gap.with_name(gap.name + ".reset").write_text("")
    deadline = time.monotonic() + 2
    while (
        any(g.with_name(g.name + ".reset").exists() for g in gaps) and time.monotonic() < deadline
    ):
        time.sleep(0.005)  # the targets' tickers take the reset: no event to wait on


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    binary = find_py_spy()
    if binary is None:
        print("py-spy not found")
        return 1
    print(f"# stacks_cost: {binary}, {args.reps} reps, medians")
    print(
        f"{'processes':>9} {'mode':>12} {'dump ms':>9} {'worst pause ms':>15} {'idle gap ms':>12}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for count in (1, 2, 8):
            gaps = [Path(tmp) / f"gap-{count}-{i}" for i in range(count)]
            procs = [subprocess.Popen([sys.executable, "-c", TARGET, str(g)]) for g in gaps]
            try:
                started = time.monotonic()  # each target's ticker writes its file once running
                while not all(g.exists() for g in gaps) and time.monotonic() - started < 10:
                    time.sleep(0.01)
                roles = {p.pid: Role("worker", i) for i, p in enumerate(procs)}
                for native in (False, True):
                    dumps, pauses, idle = [], [], []
                    for _ in range(args.reps):
                        reset(gaps)
                        time.sleep(0.1)
                        idle.append(max(worst_gap_ms(g) for g in gaps))
                        reset(gaps)
                        started = time.monotonic()
                        out = dump_processes(binary, roles, native, lambda _pid: None)
                        dumps.append((time.monotonic() - started) * 1000)
                        assert all(p.threads for p in out), [p.error for p in out]
                        time.sleep(0.05)
                        pauses.append(max(worst_gap_ms(g) for g in gaps))
                    mode = "--native" if native else "nonblocking"
                    print(
                        f"{count:>9} {mode:>12} {statistics.median(dumps):>9.1f} "
                        f"{statistics.median(pauses):>15.1f} {statistics.median(idle):>12.1f}"
                    )
            finally:
                for p in procs:
                    p.kill()
                    p.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
