"""Death latency benchmark (issue 3).

For each way of dying, DEATHS children die back to back under a real daemon (zero backoff).
Each child writes time.time() just before it dies and at its very first statement.
Measured: death -> the `exit` record's timestamp (written as the record goes to disk), and
death -> the relaunched child's first statement.  Median and max per mode.

    python tests/perf/death_latency.py [--deaths 25] [--modes exit,segv,sigkill,partial_sigkill,grandchild]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _bench import daemon_argv

from dflashd.logs import EventRecord, LineRecord, read_records
from dflashd.logs.records import parse_timestamp

CHILD = Path(__file__).with_name("_dying_child.py")


def measure(mode: str, deaths: int, work: Path) -> dict[str, float | int | str]:
    home, marks = work / f"home-{mode}", work / f"marks-{mode}"
    marks.mkdir()
    config = work / f"{mode}.toml"
    config.write_text(
        'gpus = "none"\n[restart]\nbackoff_initial_s = 0.0\nclear_cache_on_early_death = false\n'
        f"early_retries = {deaths - 1}\n"
    )
    argv = daemon_argv(home, config, [sys.executable, str(CHILD), mode, str(marks)])
    subprocess.run(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600, check=False
    )
    records = list(read_records(home / "logs"))
    exits = {
        r.run: parse_timestamp(r.ts)
        for r in records
        if isinstance(r, EventRecord) and r.event == "exit"
    }
    to_exit, to_relaunch = [], []
    for run, exit_at in exits.items():
        death = float((marks / f"death-{run}").read_text())
        to_exit.append((exit_at - death) * 1000)
        nxt = marks / f"start-{run + 1}"
        if nxt.exists():
            to_relaunch.append((float(nxt.read_text()) - death) * 1000)
    partial = sum(1 for r in records if isinstance(r, LineRecord) and r.partial)
    return {
        "mode": mode,
        "deaths": len(to_exit),
        "exit_median_ms": statistics.median(to_exit),
        "exit_max_ms": max(to_exit),
        "relaunch_median_ms": statistics.median(to_relaunch) if to_relaunch else float("nan"),
        "relaunch_max_ms": max(to_relaunch) if to_relaunch else float("nan"),
        "partial_lines": partial,
    }


def bare_parent_floor(deaths: int, work: Path) -> tuple[float, float]:
    """The floor on this machine: a bare parent (wakeup fd + waitpid, nothing else) seeing the same deaths."""
    import os
    import selectors
    import signal

    marks = work / "marks-floor"
    marks.mkdir()
    read_fd, write_fd = os.pipe2(os.O_NONBLOCK)
    old = signal.set_wakeup_fd(write_fd)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    selector = selectors.DefaultSelector()
    selector.register(read_fd, selectors.EVENT_READ)
    seen = []
    for i in range(deaths):
        env = {**os.environ, "DFLASHD_RUN": str(i)}
        proc = subprocess.Popen(
            [sys.executable, str(CHILD), "exit", str(marks)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        while True:
            selector.select()
            os.read(read_fd, 4096)
            pid, _ = os.waitpid(proc.pid, os.WNOHANG)
            if pid:
                proc.returncode = 3
                break
        seen.append((time.time() - float((marks / f"death-{i}").read_text())) * 1000)
    signal.set_wakeup_fd(old)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    return statistics.median(seen), max(seen)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--deaths", type=int, default=25)
    parser.add_argument("--modes", default="exit,segv,sigkill,partial_sigkill,grandchild")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dflashd-death-") as tmp:
        print(f"# death_latency: {args.deaths} deaths per mode, zero backoff")
        floor_med, floor_max = bare_parent_floor(args.deaths, Path(tmp))
        print(
            f"floor (a bare parent: wakeup fd + waitpid, same child exiting): median {floor_med:.2f}ms, max {floor_max:.2f}ms"
        )
        print(
            f"{'mode':16s} {'deaths':>6s} {'exit med':>9s} {'exit max':>9s} {'relaunch med':>13s} {'relaunch max':>13s}"
        )
        for mode in args.modes.split(","):
            r = measure(mode, args.deaths, Path(tmp))
            print(
                f"{r['mode']:16s} {r['deaths']:6d} {r['exit_median_ms']:7.2f}ms {r['exit_max_ms']:7.2f}ms "
                f"{r['relaunch_median_ms']:11.2f}ms {r['relaunch_max_ms']:11.2f}ms"
                + (
                    f"   partial lines logged: {r['partial_lines']}"
                    if mode == "partial_sigkill"
                    else ""
                )
            )


if __name__ == "__main__":
    main()
