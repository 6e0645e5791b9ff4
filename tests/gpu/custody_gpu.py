"""Custody on a GPU host (issue 21), run by tests/gpu/run_gpu_checks.sh.

For each custody mode the host offers (its default, then DFLASHD_CUSTODY=pidfd):
1. The bundled trainer (flex compiled per thread) under dflashd: the first step, status --json
   (custody mode, the child's GPU memory).
2. SIGKILL of the trainer: the exit verdict, the dead run's GPU memory released before the
   relaunch, and the relaunched run's first step.
3. A job that escapes its session (setsid + double fork) holding 2 GiB: after stop, no process
   of the run is left and its GPU memory is free.
Writes $OUT/custody_gpu.json.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import closing
from pathlib import Path
from typing import Any

from dflashd.logs import EventRecord, follow, read_records

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: find tests/
from tests.helpers import daemon_argv

HERE = Path(__file__).parent
RESULTS: dict[str, Any] = {}


def say(text: str) -> None:
    print(text, flush=True)


def cli(home: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "dflashd.supervisor", *args, "--home", str(home)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


def wait_event(home: Path, pred: Any, timeout: float) -> EventRecord:
    deadline = time.monotonic() + timeout
    stream = follow(home / "logs", poll_s=0.05, should_stop=lambda: time.monotonic() > deadline)
    with closing(stream):
        for record in stream:
            if isinstance(record, EventRecord) and pred(record):
                return record
    raise AssertionError(f"no matching record within {timeout}s")


def events(home: Path, name: str) -> list[EventRecord]:
    return [
        r for r in read_records(home / "logs") if isinstance(r, EventRecord) and r.event == name
    ]


def trainer_case(work: Path, label: str, env: dict[str, str]) -> dict[str, Any]:
    home = work / f"home-{label}"
    config = work / f"{label}.toml"
    config.write_text("[restart]\nbackoff_initial_s = 1.0\nbackoff_max_s = 1.0\n")
    argv = daemon_argv(home, config)
    daemon = subprocess.Popen(
        argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    out: dict[str, Any] = {}
    try:
        first = wait_event(home, lambda r: r.event == "first_step", 300)
        launched = events(home, "launched")[0]
        out["custody"] = launched.fields.get("custody")
        out["first_step_after_s"] = first.fields.get("after_s")
        deadline = time.monotonic() + 30
        while True:  # until a GPU poll has joined the child's memory (bounded)
            status = json.loads(cli(home, "status", "--json").stdout)
            joined = any(g.get("child_memory_mib") for g in status.get("gpus", []))
            if joined or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        out["status_custody"] = status.get("custody")
        out["gpu_method"] = status.get("gpu_method")
        out["child_mib"] = [g.get("child_memory_mib") for g in status.get("gpus", [])]
        pid = int(launched.fields["pid"])
        killed_at = time.time()
        os.kill(pid, signal.SIGKILL)
        exit_rec = wait_event(home, lambda r: r.event == "exit", 60)
        out["exit"] = {k: exit_rec.fields.get(k) for k in ("verdict", "reason", "signal")}
        second = wait_event(home, lambda r: r.event == "first_step" and r.run == 2, 300)
        out["relaunch_first_step_after_s"] = second.fields.get("after_s")
        out["held"] = [e.fields for e in events(home, "gpu_memory_held")]
        out["released"] = [e.fields for e in events(home, "gpu_memory_released")]
        out["kill_to_second_first_step_s"] = round(time.time() - killed_at, 2)
        stop = cli(home, "stop", "--timeout", "30")
        out["stop_rc"] = stop.returncode
        daemon.wait(120)
        out["daemon_rc"] = daemon.returncode
        out["leftovers_recorded"] = [e.fields for e in events(home, "leftover_processes")]
    finally:
        if daemon.poll() is None:
            cli(home, "stop", "--timeout", "5")
            daemon.wait(60)
        if daemon.stderr is not None:
            err = daemon.stderr.read()
            daemon.stderr.close()
            out["daemon_stderr_tail"] = err.splitlines()[-5:]
    return out


ESCAPER = """
import os, subprocess, sys, threading
pidfile = sys.argv[1]
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        proc = subprocess.Popen([sys.executable, {alloc!r}, "2"], stdout=subprocess.PIPE, text=True)
        proc.stdout.readline()
        open(pidfile, "w").write(str(proc.pid))
        threading.Event().wait()
    os._exit(0)
print("escaped", flush=True)
threading.Event().wait()
"""


def escape_case(work: Path, label: str, env: dict[str, str]) -> dict[str, Any]:
    from dflashd.supervisor.watch.nvml import NvmlSampler

    home = work / f"esc-{label}"
    pidfile = work / f"esc-{label}.pid"
    config = work / f"esc-{label}.toml"
    config.write_text('gpus = "all"\n')
    script = work / "escaper.py"
    script.write_text(ESCAPER.format(alloc=str(HERE / "alloc_child.py")))
    argv = daemon_argv(home, config, [sys.executable, str(script), str(pidfile)])
    daemon = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    out: dict[str, Any] = {}
    holder = None
    try:
        deadline = time.monotonic() + 120
        while not pidfile.exists() and time.monotonic() < deadline:
            time.sleep(0.2)  # another process's allocation: no event to wait on
        holder = int(pidfile.read_text())
        sampler = NvmlSampler("all")
        held = sum(
            p.used_mib or 0 for r in sampler.sample() for p in r.processes if p.pid == holder
        )
        out["holder_mib_before_stop"] = held
        out["stop_rc"] = cli(home, "stop", "--timeout", "5").returncode
        daemon.wait(120)
        out["holder_alive_after_stop"] = Path(f"/proc/{holder}").exists()
        deadline = time.monotonic() + 10
        while True:  # the driver frees the memory shortly after the process is gone (bounded)
            after = sum(
                p.used_mib or 0 for r in sampler.sample() for p in r.processes if p.pid == holder
            )
            if not after or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        out["holder_mib_after_stop"] = after
        sampler.close()
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
        if holder is not None and Path(f"/proc/{holder}").exists():
            os.kill(holder, signal.SIGKILL)
    return out


def main() -> None:
    work = Path(tempfile.mkdtemp())
    base = dict(os.environ)
    for label, extra in (("default", {}), ("pidfd", {"DFLASHD_CUSTODY": "pidfd"})):
        env = {**base, **extra}
        try:
            RESULTS[f"trainer_{label}"] = trainer_case(work, label, env)
        except Exception as exc:
            RESULTS[f"trainer_{label}"] = {"error": repr(exc)}
        say(f"trainer {label}: {json.dumps(RESULTS[f'trainer_{label}'])}")
        try:
            RESULTS[f"escape_{label}"] = escape_case(work, label, env)
        except Exception as exc:
            RESULTS[f"escape_{label}"] = {"error": repr(exc)}
        say(f"escape {label}: {json.dumps(RESULTS[f'escape_{label}'])}")
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "custody_gpu.json").write_text(json.dumps(RESULTS, indent=2))


if __name__ == "__main__":
    main()
