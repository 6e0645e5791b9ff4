"""The log path side by side (issues 26, 53): the job writing straight to a file, under
supervisord, and under dflashd, in one run on the same bytes; MiB/s (the child's own), ratios to
direct and to supervisord, the launcher's own CPU per GiB and its peak RSS.  Outside ``--ci``
each launcher also runs a job that writes nothing, once a repetition: its CPU (``start``: the
launcher's start and end) is printed, and the CPU per GiB less it (``flood``), since at these
sizes a start of a fifth of a second is much of a flood's CPU.

supervisord comes from the package registry, into this benchmark's own venv (made once under
``--venv``).  ``--ci`` runs the short check (32 MiB, direct, supervisord, dflashd) and fails when
a ratio is more than 30 % worse than the one recorded in tests/perf/baseline.json in each of
three rounds (ratios only, never times).  The ratios to supervisord are the guard that cannot
slide with the machine: a page-cache write's speed depends on the box, supervisord's on the
same bytes in the same run does not.  Every run's bytes are checked, off the clock, against
the SHA-256 the child took of each stream: dflashd's records (each line a record, every byte,
in order, through rotated and compressed files), supervisord's two files, direct's size; a
mismatch is printed and fails the run.

    python tests/perf/side_by_side.py [--mib 256] [--reps 3] [--modes block,line]
    python tests/perf/side_by_side.py --ci
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final

from _bench import daemon_argv, process_cpu_s

from dflashd.logs.limits import DEFAULT_BASENAME
from dflashd.logs.logset import OpenSet
from dflashd.logs.packed import read_all

WRITER = Path(__file__).with_name("_writer_child.py")
BASELINE = Path(__file__).with_name("baseline.json")
TOLERANCE = 0.30
CI_ROUNDS = 3
MISMATCHES: list[str] = []  # every run whose copy of the bytes was not the child's


def child(mode: str, mib: float, report: Path) -> list[str]:
    return [sys.executable, str(WRITER), mode, str(mib), str(report)]


@dataclass(frozen=True)
class Result:
    mib_s: float  # the child's own, while it writes
    e2e_mib_s: float  # from its first write to the launcher's exit (or its "exited" line)
    cpu_s: float  # the launcher's own CPU, its start and its end included
    mib: float  # what the child wrote
    peak_rss_mib: float = 0.0  # the launcher's own high-water mark (VmHWM)
    mismatch: str = ""  # what the launcher's copy of the bytes lacks ("": every byte there)
    echoed: float | None = None  # dflashd: the share of the job's lines its echo wrote

    @property
    def cpu_s_per_gib(self) -> float:
        """The launcher's CPU per GiB the child wrote, its start and end included."""
        return self.cpu_s / (self.mib / 1024)

    def flood_cpu_s_per_gib(self, start_cpu_s: float) -> float:
        """The same less what the launcher spends on a job that writes nothing (its start,
        its end): the CPU the flood itself cost it, per GiB."""
        return max(0.0, self.cpu_s - start_cpu_s) / (self.mib / 1024)


def result(
    mib: float,
    report: Path,
    ended_wall: float,
    cpu_s: float,
    rss_mib: float = 0.0,
    copy: dict[str, bytes] | None = None,
) -> Result:
    """The run's figures; ``copy``: what the launcher kept of each stream (by src), checked
    against the child's digests (None: not checked here)."""
    rep = json.loads(report.read_text())
    first_write = rep["last_write"] - rep["elapsed_s"]
    mismatch = streams_mismatch(rep, copy) if copy is not None else ""
    return Result(rep["mib_s"], mib / (ended_wall - first_write), cpu_s, mib, rss_mib, mismatch)


def streams_mismatch(rep: dict[str, object], copy: dict[str, bytes]) -> str:
    """Empty when each stream's copy is what the child wrote, byte for byte; else what differs."""
    wrong = []
    for src in ("stdout", "stderr"):
        got = copy.get(src, b"")
        if hashlib.sha256(got).hexdigest() != rep[f"{src}_sha256"]:
            wrong.append(f"{src}: {len(got):,} bytes kept, not the child's")
    return "; ".join(wrong)


# A line record of the benchmark's lines (JSON-safe ASCII: the line is the string verbatim)
_LINE_RECORD: Final = re.compile(rb'"src":"(stdout|stderr)","line":"([^"]*)"}$', re.MULTILINE)


def dflashd_copy(logs: Path) -> dict[str, bytes]:
    """Each stream's lines as dflashd's records hold them, oldest first, rotated and compressed
    files included: every line, each its own record, in order, rebuilt as the stream's bytes."""
    lines: dict[bytes, list[bytes]] = {b"stdout": [], b"stderr": []}
    log_set = OpenSet(logs, DEFAULT_BASENAME)
    try:
        for _seq, handle in log_set.handles:
            handle.seek(0)  # the set read each file's first record to order them
            for src, line in _LINE_RECORD.findall(read_all(handle)):
                lines[src].append(line)
    finally:
        log_set.close()
    return {src.decode(): b"\n".join(kept) + b"\n" if kept else b"" for src, kept in lines.items()}


def peak_rss_mib(pid: int) -> float | None:
    """A live process's peak resident memory (VmHWM), None once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def direct(mode: str, mib: float, work: Path) -> Result:
    report = work / "r.json"
    with open(work / "direct.log", "wb") as out:
        subprocess.run(child(mode, mib, report), stdout=out, stderr=out, check=True)
    done = result(mib, report, time.time(), 0.0)
    size, wrote = (work / "direct.log").stat().st_size, json.loads(report.read_text())["bytes"]
    if size != wrote:  # both streams in one file, interleaved: its size is what can be checked
        return replace(done, mismatch=f"{size:,} bytes in the file of {wrote:,} written")
    return done


def pipe_ceiling(mode: str, mib: float, work: Path) -> Result:
    """Line mode: the child writing into a pipe that is read lazily (to nowhere; after a read
    of less than half a MiB the next waits 2 ms, so the writer is never woken for a line):
    about as fast as a child writing line by line can write through a pipe on this box,
    whoever reads it.  On a small box supervisord comes close to it (each write(2) of a line is
    the child's own cost), so a ratio to supervisord cannot rise far above 1 there.  (A block
    writer is held up by a lazy reader: not measured for blocks.)"""
    report = work / "r.json"
    proc = subprocess.Popen(
        child(mode, mib, report), stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    fcntl.fcntl(fd, 1031, 1 << 20)  # F_SETPIPE_SZ, as dflashd's drain asks
    while data := os.read(fd, 1 << 20):
        if len(data) < 1 << 19:
            time.sleep(0.002)  # the lazy reader's pace: the ceiling it measures
    proc.wait(60)
    return result(mib, report, time.time(), 0.0)


def pipe_ceiling_two(mode: str, mib: float, work: Path) -> Result:
    """The same lazy reading of two pipes, stdout and stderr apart, as every launcher here
    reads them (the job's lines alternate between two pipes, not one): the ceiling the
    launchers' line rates are to be read against."""
    report = work / "r.json"
    proc = subprocess.Popen(
        child(mode, mib, report), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stderr is not None
    fds = [proc.stdout.fileno(), proc.stderr.fileno()]
    for fd in fds:
        fcntl.fcntl(fd, 1031, 1 << 20)  # F_SETPIPE_SZ, as dflashd's drain asks
        os.set_blocking(fd, False)
    while fds:
        largest = 0
        for fd in list(fds):
            try:
                data = os.read(fd, 1 << 20)
            except BlockingIOError:
                continue
            if not data:
                fds.remove(fd)
            largest = max(largest, len(data))
        if largest < 1 << 19:
            time.sleep(0.002)  # the lazy reader's pace, as in pipe_ceiling
    proc.wait(60)
    return result(mib, report, time.time(), 0.0)


def watch(
    proc: subprocess.Popen[bytes], report: Path, done: Path | None
) -> tuple[float, float, float]:
    """The launcher's own CPU until it exits (``done``: its log, where it says the job
    exited, after which it is sent SIGTERM), the wall time it exited or said so, and its
    peak RSS in MiB."""
    used = rss = 0.0
    deadline = time.monotonic() + 600
    while proc.poll() is None and time.monotonic() < deadline:
        used = process_cpu_s(proc.pid) or used
        rss = peak_rss_mib(proc.pid) or rss
        said = done.read_text() if done is not None and done.exists() else ""
        if done is not None and report.exists() and "exited: job" in said:
            used = process_cpu_s(proc.pid) or used
            ended = time.time()
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
            return used, ended, rss
        time.sleep(0.01)
    return used, time.time(), rss


# The daemon as a user runs it (zstd on), with compression off, and quiet with compression off.
DFLASHD_VARIANTS: Final = {
    "dflashd": ("true", ()),
    "dflashd-plain": ("false", ()),
    "dflashd-quiet": ("false", ("--quiet",)),
}


def dflashd(mode: str, mib: float, work: Path, variant: str) -> Result:
    compress, flags = DFLASHD_VARIANTS[variant]
    report, home = work / "r.json", work / "home"
    subprocess.run(["rm", "-rf", str(home), str(report)], check=True)
    config = work / "d.toml"
    # the default rotation (100 MiB files, 10 kept) unless the records (~1.8 x the bytes) need
    # more files: a flood past them would lose its oldest by design, not by fault
    backups = max(10, int(mib * 2 / 100) + 2)
    config.write_text(
        f'gpus = "none"\n[restart]\nearly_retries = 0\n[logs]\ncompress = {compress}\n'
        f"backups = {backups}\n"
    )
    with open(work / "echo.txt", "wb") as echo:  # the echo goes to a file, as under nohup
        proc = subprocess.Popen(
            daemon_argv(home, config, child(mode, mib, report), flags=flags),
            stdout=echo,
            stderr=subprocess.DEVNULL,
        )
        used, ended, rss = watch(proc, report, None)
    done = result(mib, report, ended, used, rss, dflashd_copy(home / "logs"))
    return replace(done, echoed=None if flags else echoed_share(work / "echo.txt", report))


def echoed_share(echo: Path, report: Path) -> float:
    """The share of the job's lines the echo wrote (off the clock): it drops whole frames
    rather than hold the job up when its stream is slower than the job (counted, said)."""
    text = echo.read_bytes()
    job_lines = text.count(b" out | ") + text.count(b" err | ")
    return job_lines / max(1, json.loads(report.read_text())["lines"])


def supervisord(mode: str, mib: float, work: Path, venv: Path) -> Result:
    report = work / "r.json"
    report.unlink(missing_ok=True)
    for kept in ("job.out", "job.err"):  # supervisord appends to its log files
        (work / kept).unlink(missing_ok=True)
    conf = work / "s.conf"
    conf.write_text(
        f"[supervisord]\nlogfile={work}/supervisord.log\npidfile={work}/s.pid\nnodaemon=true\n"
        f"[program:job]\ncommand={' '.join(child(mode, mib, report))}\nautorestart=false\n"
        f"startsecs=0\nstdout_logfile={work}/job.out\nstderr_logfile={work}/job.err\n"
        "stdout_logfile_maxbytes=0\nstderr_logfile_maxbytes=0\n"
    )
    # Without PYTHONPATH: a checkout on it (the GPU scripts put one there) has a folder named
    # supervisor/ that would shadow supervisord's own package.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.Popen(
        [str(venv / "bin" / "supervisord"), "-c", str(conf)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
    )
    used, ended, rss = watch(proc, report, work / "supervisord.log")
    if not report.exists():
        said = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        raise SystemExit(f"supervisord did not run the job: {said.strip()[-500:]}")
    copy = {"stdout": (work / "job.out").read_bytes(), "stderr": (work / "job.err").read_bytes()}
    return result(mib, report, ended, used, rss, copy)


def ensure_supervisord(venv: Path, wheels: Path | None) -> bool:
    if (venv / "bin" / "supervisord").exists():
        return True
    done = subprocess.run([sys.executable, "-m", "venv", str(venv)], check=False)
    # --wheels: a host with no registry (the GPU machine) installs from a folder of wheels
    offline = ["--no-index", "--find-links", str(wheels)] if wheels else []
    pip = [str(venv / "bin" / "pip"), "install", "-q", *offline, "supervisor>=4.2"]
    # without PYTHONPATH: a supervisor package on it would read as installed, and no
    # supervisord script would be made
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    installed = done.returncode == 0 and subprocess.run(pip, check=False, env=env).returncode == 0
    return installed and (venv / "bin" / "supervisord").exists()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=float, default=256)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--modes", default="block,line")
    parser.add_argument(
        "--venv", type=Path, default=Path(tempfile.gettempdir()) / "dflashd-bench-venv"
    )
    parser.add_argument("--wheels", type=Path, help="install supervisor from this folder, offline")
    parser.add_argument("--ci", action="store_true", help="short dflashd/direct check vs baseline")
    parser.add_argument("--record", action="store_true", help="write the ratios as the baseline")
    args = parser.parse_args()
    if args.ci:
        args.mib, args.reps, args.modes = 32, 3, "block,line"
    launchers = (
        ["direct", "pipe-ceiling", "supervisord", "dflashd-plain"]
        if args.ci
        else ["direct", "pipe-ceiling", "pipe-ceiling-2", "supervisord", *DFLASHD_VARIANTS]
    )
    if "supervisord" in launchers and not ensure_supervisord(args.venv, args.wheels):
        # said loudly: the guard against supervisord did not run (no registry reached)
        print("WARNING: supervisord could not be installed; its ratios are not checked")
        launchers.remove("supervisord")
    print(f"# side_by_side: {args.mib:g} MiB, {args.reps} reps, medians; {os.cpu_count()} CPUs")
    print(
        "# dflashd: zstd on (the default); -plain: compress = false; -quiet: --quiet, no compression"
    )
    recorded: dict[str, float] = json.loads(BASELINE.read_text()) if args.ci else {}
    ratios: dict[str, float] = {}
    worse: dict[str, tuple[float, float]] = {}
    with tempfile.TemporaryDirectory(prefix="dflashd-side-") as tmp:
        work = Path(tmp)
        for mode in args.modes.split(","):
            # A ratio against a page-cache write of 32 MiB is noisy (the direct run is ~10 ms);
            # noise lowers a round at random, a regression lowers every round: the check
            # measures a mode again when it looks worse and fails only when every round does.
            for round_no in range(1, CI_ROUNDS + 1 if args.ci else 2):
                got = measure_mode(mode, args, launchers, work, round_no)
                ratios.update(got)
                worse = {k: v for k, v in worse.items() if not k.startswith(f"{mode}:")}
                worse.update(
                    (key, (got[key], value))
                    for key, value in recorded.items()
                    if key in got and got[key] < value * (1 - TOLERANCE)
                )
                if not any(key.startswith(f"{mode}:") for key in worse):
                    break
    if args.record:
        BASELINE.write_text(
            json.dumps({k: round(v, 4) for k, v in ratios.items()}, indent=2) + "\n"
        )
        print(f"recorded {BASELINE}")
    for key, (now, then) in worse.items():
        print(
            f"REGRESSION {key}: {now:.3f}x direct, recorded {then:.3f}x"
            f" (more than 30 % worse in each of {CI_ROUNDS} rounds)"
        )
    for mismatch in MISMATCHES:
        print(f"BYTES LOST {mismatch}")
    return 1 if worse or MISMATCHES else 0


LAUNCHERS: Final = ("supervisord", *DFLASHD_VARIANTS)


def run_one(name: str, mode: str, mib: float, work: Path, venv: Path) -> Result:
    """One run of one launcher (or of the direct write, or of a lazy reader) on ``mib``, with
    the dirty pages of the runs before it written back first (off the clock): a flood's
    writeback under the next run was the largest of the 2-core box's swings between runs."""
    os.sync()
    if name == "direct":
        return direct(mode, mib, work)
    if name == "pipe-ceiling":
        return pipe_ceiling(mode, mib, work)
    if name == "pipe-ceiling-2":
        return pipe_ceiling_two(mode, mib, work)
    if name == "supervisord":
        return supervisord(mode, mib, work, venv)
    return dflashd(mode, mib, work, name)


def measure_mode(
    mode: str, args: argparse.Namespace, launchers: list[str], work: Path, round_no: int
) -> dict[str, float]:
    """One round of one mode: the launchers interleaved, ``args.reps`` times; prints and
    returns each launcher's ratio to direct (medians)."""
    # the pipe's ceiling is a line-mode figure: a block writer is held up by a lazy reader
    names = [name for name in launchers if not name.startswith("pipe-ceiling") or mode == "line"]
    got: dict[str, list[Result]] = {name: [] for name in names}
    # Outside CI, each launcher's CPU for a job that writes nothing (its start and its end):
    # what a flood's CPU per GiB holds besides the flood, large at these sizes (issue 53)
    starts: dict[str, list[float]] = {name: [] for name in names if name in LAUNCHERS}
    for _ in range(args.reps):
        for name in names:
            got[name].append(run_one(name, mode, args.mib, work, args.venv))
            if name in starts and not args.ci:
                starts[name].append(run_one(name, mode, 0, work, args.venv).cpu_s)
    base = statistics.median(r.mib_s for r in got["direct"])
    e2e_base = statistics.median(r.e2e_mib_s for r in got["direct"])
    again = f" (round {round_no})" if round_no > 1 else ""
    print(
        f"\n## {mode}{again}   (MiB/s while the child writes; end to end: to the launcher's exit)"
    )
    peer = statistics.median(r.mib_s for r in got["supervisord"]) if "supervisord" in got else None
    ratios: dict[str, float] = {}
    for name, values in got.items():
        MISMATCHES.extend(f"{mode} {name}: {r.mismatch}" for r in values if r.mismatch)
        mib_s = statistics.median(r.mib_s for r in values)
        e2e = statistics.median(r.e2e_mib_s for r in values)
        cpu = statistics.median(r.cpu_s_per_gib for r in values)
        start = statistics.median(starts[name]) if starts.get(name) else None
        flood = (
            f"   flood {statistics.median(r.flood_cpu_s_per_gib(start) for r in values):4.1f}"
            f" s/GiB + start {start:4.2f} s"
            if start is not None
            else ""
        )
        rss = max(r.peak_rss_mib for r in values)
        shares = [r.echoed for r in values if r.echoed is not None]
        echoed = f"   echoed {100 * statistics.median(shares):5.1f} %" if shares else ""
        ratios[f"{mode}:{name}"] = mib_s / base
        versus = ""
        if peer and name.startswith("dflashd"):
            ratios[f"{mode}:{name}/supervisord"] = mib_s / peer
        if peer and name not in {"supervisord", "direct"}:
            versus = f"  {mib_s / peer:5.2f}x supervisord"
        kept = (
            ""
            if name.startswith("pipe-ceiling")
            else "   bytes MISMATCH"
            if any(r.mismatch for r in values)
            else "   bytes ok"
        )
        print(
            f"{name:14s} {mib_s:8.1f} MiB/s {mib_s / base:5.2f}x{versus:19s}  end to end"
            f" {e2e:8.1f} MiB/s {e2e / e2e_base:5.2f}x   CPU {cpu:5.1f} s/GiB{flood}"
            f"   peak RSS {rss:5.1f} MiB{kept}{echoed}"
        )
    return ratios


if __name__ == "__main__":
    sys.exit(main())
