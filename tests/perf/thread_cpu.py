"""Which of dflashd's threads a flood keeps busy (issue 53): each thread's share of one CPU
while the job writes, from ``/proc/PID/task``, named by one ``py-spy dump`` in mid-flood.
A thread near 100 % (its CPU plus its waits for the GIL) is the one that sets the rate.

    python tests/perf/thread_cpu.py [--mib 1024] [--mode block|line] [--variant plain]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _bench import daemon_argv

WRITER = Path(__file__).with_name("_writer_child.py")
TICK = os.sysconf("SC_CLK_TCK")


def task_cpu(pid: int) -> dict[int, float]:
    out: dict[int, float] = {}
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return out
    for task in tasks:
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[int(task.name)] = (int(fields[11]) + int(fields[12])) / TICK
    return out


def thread_names(pid: int) -> dict[int, str]:
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    try:
        text = subprocess.run(
            [spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=20
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return {
        int(m.group(1)): m.group(2) for m in re.finditer(r'Thread (\d+) \(\w+\): "([^"]+)"', text)
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=float, default=1024)
    parser.add_argument("--mode", default="block")
    parser.add_argument("--variant", default="plain", choices=("default", "plain", "quiet"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        compress = "true" if args.variant == "default" else "false"
        flags = ("--quiet",) if args.variant == "quiet" else ()
        config = work / "d.toml"
        config.write_text(
            f'gpus = "none"\n[restart]\nearly_retries = 0\n[logs]\ncompress = {compress}\n'
        )
        report = work / "r.json"
        child = [sys.executable, str(WRITER), args.mode, str(args.mib), str(report)]
        with open(work / "echo.txt", "wb") as echo:
            proc = subprocess.Popen(
                daemon_argv(work / "home", config, child, flags=flags),
                stdout=echo,
                stderr=subprocess.DEVNULL,
            )
            samples: list[tuple[float, dict[int, float]]] = []
            names: dict[int, str] = {}
            tries = 0
            while proc.poll() is None:
                samples.append((time.monotonic(), task_cpu(proc.pid)))
                busy = len(samples[-1][1]) >= 4 and _total(samples[-1]) - _total(samples[-6]) > 0.05
                if busy and tries < 5 and not any("drain" in n for n in names.values()):
                    names, tries = thread_names(proc.pid), tries + 1
                time.sleep(0.02)  # the sampling pace
        rep = json.loads(report.read_text())
    end = rep["last_write"]
    start = end - rep["elapsed_s"]
    wall_now = time.time() - time.monotonic()
    window = [s for s in samples if start <= s[0] + wall_now <= end]
    print(
        f"# {args.mib:g} MiB {args.mode}, {args.variant}: the job wrote {rep['mib_s']:.0f} MiB/s"
        f" for {rep['elapsed_s']:.2f} s; {len(window)} samples in that window"
    )
    if len(window) < 2:
        return 1
    first, last = window[0], window[-1]
    span = last[0] - first[0]
    for tid in sorted(last[1]):
        used = last[1][tid] - first[1].get(tid, last[1][tid])
        print(f"{tid:>8} {names.get(tid, '?'):28s} {100 * used / span:5.0f} % of a CPU")
    return 0


def _total(sample: tuple[float, dict[int, float]]) -> float:
    return sum(sample[1].values())


if __name__ == "__main__":
    sys.exit(main())
