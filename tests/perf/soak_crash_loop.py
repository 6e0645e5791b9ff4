"""Soak: a crash loop at zero backoff for a fixed time; is the daemon's state bounded?

A job that prints one step line and exits 3 at once (``sh -c``: no interpreter to start), so
every run is a runtime crash (the large budget), restarted without delay, for ``--seconds``.  Reports runs/s, and at start (after ``--warmup`` runs) and end: the daemon's
RSS, the size of daemon.log and its rotated files (bounded by ``logs.daemon_max_bytes`` ×
(``daemon_backups`` + 1)), and the rows in runs.sqlite (bounded by ``logs.history_runs``).

    python tests/perf/soak_crash_loop.py [--seconds 120] [--warmup 1000]

Targets (issue 16): RSS flat within 1 MiB over 20,000 runs; daemon.log within its bound.
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from _bench import cli, status

DAEMON_MAX_BYTES = 1 << 20
DAEMON_BACKUPS = 2
HISTORY_RUNS = 5000


def write_config(path: Path) -> None:
    path.write_text(
        'gpus = "none"\n'
        "start_wait_s = 0.0\n"
        "[restart]\n"
        "runtime_retries = 100000\n"
        "backoff_initial_s = 0.0\n"
        "backoff_max_s = 1.0\n"
        "clear_cache_on_early_death = false\n"
        "retry_unfixable = true\n"
        "[logs]\n"
        f"daemon_max_bytes = {DAEMON_MAX_BYTES}\n"
        f"daemon_backups = {DAEMON_BACKUPS}\n"
        f"history_runs = {HISTORY_RUNS}\n"
        "[alerts]\n"
        "on = []\n"
    )


def daemon_logs_bytes(home: Path) -> int:
    return sum(p.stat().st_size for p in home.glob("daemon.log*"))


def history_rows(home: Path) -> int:
    db = sqlite3.connect(f"file:{home / 'runs.sqlite'}?mode=ro", uri=True)
    try:
        return int(db.execute("SELECT COUNT(*) FROM runs").fetchone()[0])
    finally:
        db.close()


def snapshot(home: Path, proc: psutil.Process) -> dict[str, float]:
    st = status(home)
    return {
        "t": time.monotonic(),
        "run": float(st.get("run") or 0),
        "rss_mib": proc.memory_info().rss / 2**20,
        "daemon_log_bytes": float(daemon_logs_bytes(home)),
        "history_rows": float(history_rows(home)),
        "fds": float(proc.num_fds()),
        "threads": float(proc.num_threads()),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--warmup", type=int, default=1000, help="runs before the first snapshot")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="dflashd-soak-"))
    home, config = work / "home", work / "soak.toml"
    write_config(config)
    job = ["/bin/sh", "-c", "echo 'step 1/2 loss 1.0'; exit 3"]
    start = subprocess.run(
        [*cli(home, "start", "--config", str(config)), "--", *job],
        capture_output=True,
        text=True,
        check=False,
    )
    pid = int(status(home)["pid"])
    proc = psutil.Process(pid)
    try:
        warm_by = time.monotonic() + 300.0
        while int(status(home).get("run") or 0) < args.warmup:
            if time.monotonic() > warm_by or not proc.is_running():
                raise SystemExit(f"no {args.warmup} runs within 300 s: {status(home)}")
            time.sleep(0.5)  # the crash loop runs on its own; we only look at it now and then
        first = snapshot(home, proc)
        series = [first]
        ends = first["t"] + args.seconds
        while (left := ends - time.monotonic()) > 0:
            time.sleep(min(30.0, left))  # the measured interval itself: a look every 30 s
            series.append(snapshot(home, proc))
        last = series[-1]
    finally:
        subprocess.run(cli(home, "stop"), capture_output=True, check=False)
    runs = last["run"] - first["run"]
    bound = DAEMON_MAX_BYTES * (DAEMON_BACKUPS + 1)
    print(f"start exit {start.returncode}; crash loop of {' '.join(job)} at zero backoff")
    print(
        f"runs {first['run']:.0f} -> {last['run']:.0f}: {runs:.0f} in {args.seconds:.0f} s = {runs / args.seconds:.1f} runs/s"
    )
    print(
        f"RSS {first['rss_mib']:.2f} -> {last['rss_mib']:.2f} MiB ({last['rss_mib'] - first['rss_mib']:+.2f} MiB)"
    )
    print(
        f"daemon.log* {first['daemon_log_bytes'] / 1e6:.2f} -> {last['daemon_log_bytes'] / 1e6:.2f} MB "
        f"(bound {bound / 1e6:.2f} MB = daemon_max_bytes x (daemon_backups + 1), plus one record each)"
    )
    print(
        f"runs.sqlite rows {first['history_rows']:.0f} -> {last['history_rows']:.0f} (history_runs {HISTORY_RUNS})"
    )
    trend = ", ".join(f"{p['run']:.0f}: {p['rss_mib']:.2f}" for p in series)
    print(f"RSS (MiB) by run: {trend}")
    print(
        f"fds {first['fds']:.0f} -> {last['fds']:.0f}, threads {first['threads']:.0f} -> {last['threads']:.0f}"
    )
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
