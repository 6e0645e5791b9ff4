"""Issue 8: the threaded trainer on every GPU of one host, under dflashd (run by run_multi_gpu.sh).

1. tokens/s with 1 GPU (--workers 1) and with all GPUs (one worker thread per GPU): scaling.
2. Under `dflashd start --foreground` with gpus = "all": each worker's backend (flex compiled),
   the first step, steps advancing, and `dflashd status --json` mid-run (every GPU, child memory).
3. A fault in one worker thread (crash_at_step:N:1): verdict crashed, GPU memory released before
   the relaunch, the relaunch resumes from the checkpoint on all GPUs and completes.
Writes $OUT/multi_gpu.json.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dflashd.logs import EventRecord, LineRecord, read_records

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: find tests/
from tests.helpers import daemon_argv

STEP = re.compile(r"^step (\d+)/\d+ loss ([\d.]+) acc [\d.]+ tok/s ([\d,]+)")
RESULTS: dict[str, Any] = {}
TRAINER = [sys.executable, "-m", "dflashd.trainer"]


def say(text: str) -> None:
    print(text, flush=True)


def tok_s(lines: list[str]) -> float | None:
    values = [float(m.group(3).replace(",", "")) for line in lines if (m := STEP.match(line))]
    steady = values[len(values) // 2 :]
    return statistics.median(steady) if steady else None


def unsupervised(work: Path, workers: int, steps: int) -> dict[str, Any]:
    cmd = [
        *TRAINER,
        "--workers",
        str(workers),
        "--steps",
        str(steps),
        "--log-every",
        "10",
        "--checkpoint-dir",
        str(work / f"ck-{workers}"),
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=420)
    lines = result.stdout.splitlines()
    return {
        "workers": workers,
        "returncode": result.returncode,
        "tok_s": tok_s(lines),
        "compile": [line for line in lines if line.startswith("compile_done")],
        "stderr_tail": result.stderr.splitlines()[-5:] if result.returncode else [],
    }


def daemon(home: Path, command: list[str], **extra: Any) -> subprocess.Popen[bytes]:
    config = home.with_suffix(".toml")
    lines = ['gpus = "all"', "gpu_poll_s = 1.0"] + [
        f"{k} = {json.dumps(v)}" for k, v in extra.items()
    ]
    config.write_text(
        "\n".join(lines)
        + "\n[restart]\nbackoff_initial_s = 0.5\nruntime_retries = 2\nearly_retries = 0\n"
    )
    argv = [
        *daemon_argv(home, config, list(command), flags=()),
    ]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def status(home: Path) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "dflashd.supervisor", "status", "--home", str(home), "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    return json.loads(out.stdout) if out.stdout.strip() else {}


def supervised(work: Path, gpus: int) -> None:
    home = work / "sup"
    proc = daemon(
        home,
        [*TRAINER, "--steps", "300", "--log-every", "10", "--checkpoint-dir", str(work / "ck-sup")],
    )
    snapshot: dict[str, Any] = {}
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        snap = status(home)
        held = [g for g in snap.get("gpus") or [] if (g.get("child_memory_mib") or 0) > 0]
        if snap.get("phase") == "training" and len(held) == gpus and (snap.get("step") or 0) > 20:
            snapshot = snap
            break
        time.sleep(1.0)
    proc.wait(420)
    records = list(read_records(home / "logs"))
    lines = [r.line for r in records if isinstance(r, LineRecord)]
    RESULTS["supervised"] = {
        "status_json_mid_run": {
            k: snapshot.get(k)
            for k in ("state", "phase", "run", "step", "gpus", "gpu_checks", "gpu_method")
        },
        "compile": [line for line in lines if line.startswith("compile_done")],
        "first_step": [
            r.fields for r in records if isinstance(r, EventRecord) and r.event == "first_step"
        ],
        "exit": [
            r.fields.get("verdict")
            for r in records
            if isinstance(r, EventRecord) and r.event == "exit"
        ],
        "tok_s": tok_s(lines),
    }
    say(f"supervised: {json.dumps(RESULTS['supervised'])[:3000]}")


def fault(work: Path) -> None:
    home = work / "fault"
    cmd = [
        *TRAINER,
        "--steps",
        "200",
        "--log-every",
        "10",
        "--checkpoint-every",
        "50",
        "--inject",
        "crash_at_step:120:1",
        "--checkpoint-dir",
        str(work / "ck-fault"),
    ]
    proc = daemon(home, cmd)
    proc.wait(600)
    records = list(read_records(home / "logs"))
    events = [(r.run, r.event, r.fields) for r in records if isinstance(r, EventRecord)]
    lines = [(r.run, r.line) for r in records if isinstance(r, LineRecord)]
    RESULTS["fault"] = {
        "exits": [
            (run, f.get("verdict"), f.get("reason"), f.get("step"))
            for run, e, f in events
            if e == "exit"
        ],
        "gpu_memory_events": [
            (run, e, f)
            for run, e, f in events
            if e.startswith("gpu_memory") or e == "gpu_release_timeout"
        ],
        "crash_line": [line for run, line in lines if "injected crash" in line][:1],
        "resumed": [line for run, line in lines if line.startswith("resumed from")],
        "run2_compile": [
            line for run, line in lines if run == 2 and line.startswith("compile_done")
        ],
        "run2_last_step_line": [
            line for run, line in lines if run == 2 and line.startswith("step ")
        ][-1:],
    }
    say(f"fault: {json.dumps(RESULTS['fault'])[:3000]}")


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="dflashd-multi-"))
    import torch

    gpus = torch.cuda.device_count()
    RESULTS["gpus"] = gpus
    one = unsupervised(work, 1, 150)
    say(f"1 GPU: {one}")
    every = unsupervised(work, gpus, 150)
    say(f"{gpus} GPUs: {every}")
    RESULTS["scaling"] = {"one": one, "all": every}
    if one["tok_s"] and every["tok_s"]:
        RESULTS["scaling"]["speedup"] = round(every["tok_s"] / one["tok_s"], 3)
        RESULTS["scaling"]["efficiency"] = round(every["tok_s"] / one["tok_s"] / gpus, 3)
    try:
        supervised(work, gpus)
    except Exception as exc:
        RESULTS["supervised"] = f"FAILED: {exc!r}"
        say(f"supervised FAILED: {exc!r}")
    try:
        fault(work)
    except Exception as exc:
        RESULTS["fault"] = f"FAILED: {exc!r}"
        say(f"fault FAILED: {exc!r}")
    out = os.environ.get("OUT")
    if out:
        Path(out, "multi_gpu.json").write_text(json.dumps(RESULTS, indent=2, default=str))
    say(json.dumps(RESULTS, indent=2, default=str)[:6000])


if __name__ == "__main__":
    main()
