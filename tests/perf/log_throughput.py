"""Log throughput benchmark (issue 2; rerun through the daemon for issue 3).

A real child writes MIB MiB of ~120-byte step lines (1 in 16 to stderr) in block mode
(~64 KiB writes) and line mode (one write per line).  Side by side, same run, medians of
REPS repetitions, the child's own MiB/s when its output goes:
  direct  - to files by shell redirection (the limit)
  tee     - through tee
  logs    - through dflashd.logs (pipe -> framer -> rotating writer, 100 MiB files)
  daemon  - through the whole dflashd daemon (`dflashd start --foreground --quiet`)
  echo    - the same, echoing every line to its stdout, a pipe read as fast as it comes
  stuck   - the same, echoing to a pipe nobody reads (a terminal that froze): the job must not care
plus the data lag at a low rate (a line every 10 ms: write -> record on disk), and a check
that every line is present, in order, in its own record.

    python tests/perf/log_throughput.py [--mib 512] [--reps 3] [--modes block,line]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from _bench import daemon_argv

from dflashd.logs import LineRecord, LogSink, RotatingLogWriter, follow, read_records
from dflashd.logs.drain import PipeDrain, grow_pipe

CHILD = Path(__file__).with_name("_writer_child.py")


def child_argv(mode: str, mib: float, report: Path) -> list[str]:
    return [sys.executable, str(CHILD), mode, str(mib), str(report)]


def read_report(report: Path) -> dict[str, float]:
    return json.loads(report.read_text())


def run_direct(mode: str, mib: float, work: Path) -> float:
    report = work / "report.json"
    cmd = " ".join(child_argv(mode, mib, report)) + f" > {work}/out.txt 2> {work}/err.txt"
    subprocess.run(cmd, shell=True, check=True)
    return read_report(report)["mib_s"]


def run_tee(mode: str, mib: float, work: Path) -> float:
    report = work / "report.json"
    cmd = (
        " ".join(child_argv(mode, mib, report))
        + f" 2> >(tee {work}/err.txt > /dev/null) | tee {work}/out.txt > /dev/null"
    )
    subprocess.run(["bash", "-c", cmd], check=True)
    return read_report(report)["mib_s"]


def run_library(mode: str, mib: float, work: Path) -> tuple[float, float, Path]:
    """Child -> pipes -> PipeDrain x2 -> LogSink -> RotatingLogWriter. Returns MiB/s, drain lag, log dir."""
    report = work / "report.json"
    logdir = work / "lib-logs"
    shutil.rmtree(logdir, ignore_errors=True)
    sink = LogSink(RotatingLogWriter(logdir, max_bytes=100 * 2**20, backups=10))
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    grow_pipe(out_r)
    grow_pipe(err_r)
    proc = subprocess.Popen(child_argv(mode, mib, report), stdout=out_w, stderr=err_w)
    os.close(out_w)
    os.close(err_w)
    drains = [
        PipeDrain(out_r, run=1, src="stdout", sink=sink),
        PipeDrain(err_r, run=1, src="stderr", sink=sink),
    ]
    proc.wait()
    for drain in drains:
        drain.wait_eof(600)
    sink.flush(600)
    done = time.time()
    sink.close()
    rep = read_report(report)
    return rep["mib_s"], done - rep["last_write"], logdir


def run_daemon(mode: str, mib: float, work: Path, echo: str = "quiet") -> tuple[float, Path]:
    """The whole daemon; ``echo``: "quiet" (none), "read" (to a pipe drained at once), "stuck"."""
    report = work / "report.json"
    home = work / "home"
    shutil.rmtree(home, ignore_errors=True)
    config = work / "bench.toml"
    config.write_text('gpus = "none"\n[restart]\nearly_retries = 0\n')
    flags: tuple[str, ...] = ("--quiet",) if echo == "quiet" else ()
    argv = daemon_argv(home, config, [*child_argv(mode, mib, report)], flags=flags)
    if echo == "quiet":
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return read_report(report)["mib_s"], home / "logs"
    out_r, out_w = os.pipe()
    proc = subprocess.Popen(argv, stdout=out_w, stderr=subprocess.DEVNULL)
    os.close(out_w)
    reader = None
    if echo == "read":

        def drain() -> None:
            while os.read(out_r, 1 << 20):
                pass

        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
    # "stuck": the read end stays open and unread until the daemon has exited.
    rep_mib_s: float | None = None
    while proc.poll() is None:
        if report.exists() and rep_mib_s is None:
            try:
                rep_mib_s = read_report(report)["mib_s"]
            except (ValueError, KeyError):
                pass
        time.sleep(0.05)  # a sampling pace: CPU and RSS read while it runs
    if reader is not None:
        reader.join(10)
    os.close(out_r)
    return read_report(report)["mib_s"], home / "logs"


def verify(logdir: Path, expected_lines: int) -> str:
    """Every line present, once, in order per stream, each in its own record."""
    numbers: dict[str, list[int]] = {"stdout": [], "stderr": []}
    last_seq = 0
    for rec in read_records(logdir):
        assert rec.seq == last_seq + 1 or last_seq == 0, f"seq gap at {rec.seq}"
        last_seq = rec.seq
        if isinstance(rec, LineRecord):
            numbers[rec.src].append(int(rec.line[5:14]))
    total = len(numbers["stdout"]) + len(numbers["stderr"])
    merged = sorted(numbers["stdout"] + numbers["stderr"])
    ok = (
        total == expected_lines
        and merged == list(range(expected_lines))
        and numbers["stdout"] == sorted(numbers["stdout"])
        and numbers["stderr"] == sorted(numbers["stderr"])
        and all(n % 16 == 15 for n in numbers["stderr"])
    )
    return (
        f"{total:,} lines, all present and ordered"
        if ok
        else f"MISMATCH: {total:,} of {expected_lines:,}"
    )


def low_rate_lag(work: Path, through_daemon: bool, lines: int = 200) -> list[float]:
    """Write a line every 10 ms; a follower notes when each reaches the log file."""
    report = work / "report.json"
    arrivals: dict[int, float] = {}
    if through_daemon:
        home = work / "lag-home"
        shutil.rmtree(home, ignore_errors=True)
        logdir = home / "logs"
        config = work / "lag.toml"
        config.write_text('gpus = "none"\n[restart]\nearly_retries = 0\n')
        argv = daemon_argv(home, config, [*child_argv("slow", lines, report)])
    else:
        logdir = work / "lag-logs"
        shutil.rmtree(logdir, ignore_errors=True)
    done = threading.Event()

    def watch() -> None:
        for rec in follow(
            logdir, poll_s=0.001, should_stop=lambda: done.is_set() and len(arrivals) >= lines
        ):
            if isinstance(rec, LineRecord) and rec.line.startswith("sent "):
                arrivals[int(rec.line.split()[2])] = time.time() - float(rec.line.split()[1])

    watcher = threading.Thread(target=watch)
    watcher.start()
    if through_daemon:
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    else:
        sink = LogSink(RotatingLogWriter(logdir))
        out_r, out_w = os.pipe()
        proc = subprocess.Popen(child_argv("slow", lines, report), stdout=out_w)
        os.close(out_w)
        drain = PipeDrain(out_r, run=1, src="stdout", sink=sink)
        proc.wait()
        drain.wait_eof(30)
        sink.flush(30)
        sink.close()
    done.set()
    watcher.join(30)
    return sorted(arrivals.values())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mib", type=float, default=512)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--modes", default="block,line")
    parser.add_argument("--no-daemon", action="store_true")
    parser.add_argument("--no-echo", action="store_true", help="skip the echo and stuck runs")
    args = parser.parse_args()
    line_bytes = len(b"step %09d loss %5.3f tok/s 51,200 lr 3e-4 " % (0, 0.0)) + 65
    expected = int(args.mib * 2**20) // line_bytes
    with tempfile.TemporaryDirectory(prefix="dflashd-bench-") as tmp:
        work = Path(tmp)
        print(
            f"# log_throughput: {args.mib:g} MiB per run, {args.reps} reps, medians (child's own MiB/s)"
        )
        for mode in args.modes.split(","):
            results: dict[str, list[float]] = {
                "direct": [],
                "tee": [],
                "logs": [],
                "daemon": [],
                "echo": [],
                "stuck": [],
            }
            lags: list[float] = []
            logdir = daemon_logs = None
            for _ in range(args.reps):
                results["direct"].append(run_direct(mode, args.mib, work))
                results["tee"].append(run_tee(mode, args.mib, work))
                mib_s, lag, logdir = run_library(mode, args.mib, work)
                results["logs"].append(mib_s)
                lags.append(lag)
                if not args.no_daemon:
                    mib_s, daemon_logs = run_daemon(mode, args.mib, work)
                    results["daemon"].append(mib_s)
                    if not args.no_echo:
                        results["echo"].append(run_daemon(mode, args.mib, work, "read")[0])
                        results["stuck"].append(run_daemon(mode, args.mib, work, "stuck")[0])
            direct = statistics.median(results["direct"])
            print(f"\n## {mode} mode")
            for name, values in results.items():
                if not values:
                    continue
                med = statistics.median(values)
                spread = ", ".join(f"{v:.0f}" for v in values)
                print(f"{name:7s} {med:8.1f} MiB/s  {med / direct:5.2f}x direct   [{spread}]")
            print(
                f"drain lag after a flood (last write -> all on disk): median {statistics.median(lags) * 1000:.0f} ms"
            )
            if logdir is not None:
                print(f"check (logs):   {verify(logdir, expected)}")
            if daemon_logs is not None:
                print(f"check (daemon): {verify(daemon_logs, expected)}")
        for through_daemon in (False, True):
            if through_daemon and args.no_daemon:
                continue
            lag = low_rate_lag(work, through_daemon)
            label = "daemon" if through_daemon else "logs"
            if lag:
                print(
                    f"\nlow-rate lag ({label}, line every 10 ms, write -> record on disk): "
                    f"median {statistics.median(lag) * 1000:.1f} ms, p99 {lag[int(len(lag) * 0.99) - 1] * 1000:.1f} ms, "
                    f"max {lag[-1] * 1000:.1f} ms over {len(lag)} lines"
                )


if __name__ == "__main__":
    main()
