"""Big logs: `report`, `tail` and compression on a 1 GB run log.

Writes a run log of ``--gb`` GB with dflashd's own writer (the same bytes the daemon writes:
85-byte step lines like a real trainer's, batched as the drains batch them, a ``progress``
record every 2,000 lines, 20 runs each ending with ``exit`` and ``restart``), rotated at the
default 100 MiB.  Then times, each in a fresh process (the CLI as a user runs it):

- ``dflashd report`` (all runs, and one run), ``tail -n 50``, ``tail --grep``, ``tail --since``;
- gzip (stdlib, level 6) and, when the ``zstandard`` module is installed, zstd (level 3) on one
  rotated 100 MiB file: ratio and CPU seconds per 100 MiB.

    python tests/perf/big_log.py [--gb 1.0] [--keep DIR]

Target (issue 16): report on 1 GB in under 3 s on the 2-core machine.
"""

from __future__ import annotations

import argparse
import gzip
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _bench import cli

from dflashd.logs.framer import Frame
from dflashd.logs.writer import RotatingLogWriter

LINES_PER_FRAME = 64
RUNS = 20


def step_line(step: int) -> bytes:
    loss = 4.0 / (1 + step / 5000)
    return (
        f"step {step}/1000000 | loss {loss:.4f} | lr 3.00e-04 | tok/s 812,345 | "
        f"grad_norm 0.8{step % 10}"
    ).encode()


def write_log(home: Path, gb: float, compress: bool) -> tuple[int, float]:
    """The log; returns (lines, seconds)."""
    logs = home / "logs"
    writer = RotatingLogWriter(logs, max_bytes=100 * 1024 * 1024, backups=20, compress=compress)
    target = int(gb * 1e9)
    per_run = target // RUNS
    lines, t0, wall = 0, time.perf_counter(), time.time() - 86400.0
    for run in range(1, RUNS + 1):
        writer.write_event(run, "spawn", {"argv": ["python", "train.py"], "cwd": "."})
        writer.write_event(run, "launched", {"pid": 1000 + run, "pgid": 1000 + run})
        start_bytes, step = writer.stats().bytes_written, 0
        writer.write_event(run, "first_step", {"after_s": 12.5, "step": 1, "source": "nanogpt"})
        while writer.stats().bytes_written - start_bytes < per_run:
            batch = [step_line(step + i) for i in range(LINES_PER_FRAME)]
            wall += 0.05
            writer.write_frame(run, "stdout", Frame(None, None, 0, batch), wall)
            step += LINES_PER_FRAME
            lines += LINES_PER_FRAME
            if step % 2048 == 0:
                loss = 4.0 / (1 + step / 5000)
                writer.write_event(
                    run, "progress", {"step": step, "source": "nanogpt", "loss": loss}
                )
        exit_fields = {"exit_code": 1, "verdict": "crashed", "reason": "exit_code_1", "step": step}
        writer.write_event(run, "exit", {**exit_fields, "duration_s": 3600.0, "tail": []})
        writer.write_event(run, "restart", {"delay_s": 1.0, "verdict": "crashed"})
    writer.close()
    return lines, time.perf_counter() - t0


def timed(argv: list[str]) -> tuple[float, int, str]:
    t0 = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    return time.perf_counter() - t0, done.returncode, (done.stdout + done.stderr).strip()[-160:]


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def compression(sample: Path) -> None:
    data = sample.read_bytes()
    mib = len(data) / 2**20
    t0 = cpu_s()
    packed = gzip.compress(data, compresslevel=6)
    gz_cpu = cpu_s() - t0
    print(
        f"gzip -6  on {sample.name} ({mib:.0f} MiB): ratio {len(data) / len(packed):.1f}x, "
        f"{gz_cpu:.2f} CPU s ({gz_cpu / mib * 100:.2f} CPU s per 100 MiB)"
    )
    try:
        import zstandard  # type: ignore[import-not-found]
    except ImportError:
        print("zstd: the zstandard module is not installed here (pip install zstandard)")
        return
    t0 = cpu_s()
    packed = zstandard.ZstdCompressor(level=3).compress(data)
    z_cpu = cpu_s() - t0
    print(
        f"zstd -3  on {sample.name} ({mib:.0f} MiB): ratio {len(data) / len(packed):.1f}x, "
        f"{z_cpu:.2f} CPU s ({z_cpu / mib * 100:.2f} CPU s per 100 MiB)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=1.0)
    parser.add_argument("--keep", type=Path, help="write the log here and keep it")
    parser.add_argument(
        "--compress",
        action="store_true",
        help="gzip rotated files as the daemon does (logs.compress)",
    )
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="dflashd-biglog-"))
    home = work / "home"
    if not (home / "logs").is_dir():
        lines, secs = write_log(home, args.gb, args.compress)
        print(f"wrote {lines:,} lines in {secs:.1f} s")
    size = sum(p.stat().st_size for p in (home / "logs").iterdir())
    files = sorted((home / "logs").iterdir())
    print(f"log: {size / 1e9:.2f} GB on disk in {len(files)} files")
    out = work / "report.html"
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() - 86400.0 + 3000))
    for label, argv in [
        ("report (all runs)", cli(home, "report", "-o", str(out))),
        ("report --run 20", cli(home, "report", "--run", "20", "-o", str(out))),
        ("tail -n 50", cli(home, "tail", "-n", "50")),
        ("tail --grep 'step 99999/' -n 5", cli(home, "tail", "--grep", "step 99999/", "-n", "5")),
        (f"tail --since {since} -n 5", cli(home, "tail", "--since", since, "-n", "5")),
    ]:
        secs, rc, text = timed(argv)
        print(f"{label:40s} {secs:6.2f} s  rc={rc}  {text.splitlines()[-1] if text else ''}"[:200])
    # The baseline, in this run: what report did before issue 16 (parse every record, then filter).
    from dflashd.logs import read_records

    t0 = time.perf_counter()
    kept = sum(1 for r in read_records(home / "logs") if r.src == "dflashd")
    print(
        f"{'baseline: parse every record':40s} {time.perf_counter() - t0:6.2f} s  ({kept} dflashd records)"
    )
    rotated = [p for p in files if p.name.endswith(".1")]  # (none when --compress)
    if rotated:
        compression(rotated[0])
    if args.keep is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
