"""Compression off the daemon's back (issue 26): the daemon with compression on and off, side
by side, and the helper's own CPU per GiB for zstd and gzip.

A block flood of ``--mib`` MiB of step lines through the foreground daemon, 16 MiB files,
nothing deleted.  Per run: the child's MiB/s, end to end (launch to the daemon's exit), the
exit's hold (the child's last write to the daemon's exit), and the daemon's own CPU per GiB
(sampled from /proc until it exits; the helper is a process of its own), and the helpers' CPU
in the run, per GiB of log (every rotation's helper start included).  Then the helper alone on
the same files (one start): CPU per GiB of log and the ratio for zstd -1 and gzip -6.

    python tests/perf/compress_cost.py [--mib 256] [--reps 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _bench import daemon_argv, process_cpu_s

from dflashd.logs import read_records
from dflashd.logs.compress import helper_argv, helper_env
from dflashd.logs.packed import zstd_home

WRITER = Path(__file__).with_name("_writer_child.py")


def run(work: Path, mib: float, compress: bool) -> dict[str, float]:
    home = work / f"home-{compress}"
    subprocess.run(["rm", "-rf", str(home)], check=True)
    config = work / f"c-{compress}.toml"
    config.write_text(
        'gpus = "none"\n[restart]\nearly_retries = 0\n'
        f"[logs]\nmax_bytes = {16 * 2**20}\nbackups = 1000\ncompress = {str(compress).lower()}\n"
    )
    report = work / "report.json"
    argv = daemon_argv(home, config, [sys.executable, str(WRITER), "block", str(mib), str(report)])
    started = time.monotonic()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    used = 0.0
    while proc.poll() is None:
        used = process_cpu_s(proc.pid) or used
        time.sleep(0.05)  # a sampling pace: CPU read while it runs
    ended = time.monotonic()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # The daemon, its job and every helper it reaped, minus the daemon and the job: the helpers.
    family = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    ended_wall = time.time()
    import json

    rep = json.loads(report.read_text())
    files = list((home / "logs").iterdir())
    packed = [p for p in files if p.name.endswith((".zst", ".gz"))]
    log_gib = sum(p.stat().st_size for p in files if not p.name.endswith((".zst", ".gz")))
    log_gib = (log_gib + packed_input_bytes(packed)) / 2**30
    return {
        "child_mib_s": rep["mib_s"],
        "e2e_mib_s": mib / (ended - started),
        "exit_hold_s": ended_wall - rep["last_write"],
        "daemon_cpu_s_per_gib": used / (mib / 1024),
        "packed_files": float(len(packed)),
        "log_mib_on_disk": sum(p.stat().st_size for p in files) / 2**20,
        # Helpers' CPU (compression, and what else the daemon starts) per GiB of log written;
        # "off" shows this estimate's own error (the daemon's last 50 ms are not sampled).
        "helpers_cpu_s_per_log_gib": max(0.0, family - used - rep["cpu_s"]) / log_gib,
    }


def packed_input_bytes(packed: list[Path]) -> int:
    """What the packed files hold, uncompressed."""
    total = 0
    for path in packed:
        with open(path, "rb") as fh:
            if path.name.endswith(".zst"):
                import zstandard

                total += sum(len(c) for c in zstandard.ZstdDecompressor().read_to_iter(fh))
            else:
                import gzip

                total += len(gzip.decompress(fh.read()))
    return total


def helper_cost(files: list[Path], codec: str, work: Path) -> tuple[float, float]:
    """CPU seconds per GiB of input, and the ratio, of the helper on ``files``."""
    outs, jobs, fds = [], [], []
    for i, path in enumerate(files):
        fh = open(path, "rb")
        fds.append(fh)
        out = work / f"out-{codec}-{i}"
        out.unlink(missing_ok=True)
        outs.append(out)
        jobs.append(f"{fh.fileno()}={out}")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(
        helper_argv(codec, os.getpid(), jobs),
        pass_fds=tuple(f.fileno() for f in fds),
        env=helper_env(zstd_home()),
        check=True,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    for fh in fds:
        fh.close()
    used = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    size_in = sum(p.stat().st_size for p in files)
    size_out = sum(p.stat().st_size for p in outs)
    return used / (size_in / 2**30), size_in / size_out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=float, default=256)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    print(f"# compress_cost: {args.mib:g} MiB block flood, 16 MiB files, {args.reps} reps, medians")
    with tempfile.TemporaryDirectory(prefix="dflashd-compress-") as tmp:
        work = Path(tmp)
        rows: dict[bool, list[dict[str, float]]] = {False: [], True: []}
        for _ in range(args.reps):
            for compress in (False, True):
                rows[compress].append(run(work, args.mib, compress))
        keys = list(rows[False][0])
        print(f"{'':22s} {'compress off':>14s} {'compress on':>14s}")
        for key in keys:
            off = statistics.median(r[key] for r in rows[False])
            on = statistics.median(r[key] for r in rows[True])
            print(f"{key:22s} {off:14.2f} {on:14.2f}")
        e2e_off = statistics.median(r["e2e_mib_s"] for r in rows[False])
        e2e_on = statistics.median(r["e2e_mib_s"] for r in rows[True])
        print(f"end to end, on / off: {e2e_on / e2e_off:.3f}")
        home = work / "home-False" / "logs"
        files = sorted(p for p in home.iterdir() if p.is_file() and p.name != "dflashd.jsonl")
        assert sum(1 for _ in read_records(home)) > 0
        for codec in ("zstd", "gzip"):
            per_gib, ratio = helper_cost(files, codec, work)
            print(f"helper {codec}: {per_gib:.2f} CPU s per GiB, {ratio:.1f}x smaller")
    return 0


if __name__ == "__main__":
    sys.exit(main())
