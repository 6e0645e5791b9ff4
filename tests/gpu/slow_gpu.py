"""Issue 43 on a GPU: a second process started on the job's GPU is named as the cause of a
slow incident within 120 s, and a clean run raises no incident.  Under 10 minutes a call:

    python3 tests/gpu/slow_gpu.py intruder            (after tests/gpu/_env.sh)
    python3 tests/gpu/slow_gpu.py clean 540

The job (written here) steps on cuda:0, about 25 ms of matmuls a step, a checkpoint-like pause
every 400 steps, and prints ``step N loss X``.  ``intruder``: once dflashd has learnt the job's
pace, another process (not the job's) runs matmuls on the same GPU until the ``slow`` record
names it, then ends; the incident must close after.  ``clean S``: S seconds of stepping, then a
stop; no ``slow`` and no ``diverged`` record.  Prints the step times and the detection time.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

JOB = r"""
import math, sys, time
import torch
dev = torch.device("cuda")
x = torch.randn(4096, 4096, device=dev)
w = torch.randn(4096, 4096, device=dev)
end = time.monotonic() + float(sys.argv[1])
step = 0
while time.monotonic() < end:
    step += 1
    for _ in range(4):
        y = x @ w
    torch.cuda.synchronize()
    if step % 400 == 0:
        time.sleep(2.0)  # a checkpoint: no step for a while
    print(f"step {step} loss {2.0 + 0.2 * math.sin(step / 50):.4f}", flush=True)
"""

INTRUDER = r"""
import torch
a = torch.randn(8192, 8192, device="cuda")
while True:
    b = a @ a
    torch.cuda.synchronize()
"""


def _events(home: Path) -> list[dict]:
    out = []
    for path in sorted((home / "logs").glob("dflashd.jsonl*")):
        if path.suffix in (".zst", ".gz"):
            continue
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # the line being written
            if rec.get("src") == "dflashd":
                out.append(rec)
    return out


def _wait(home: Path, event: str, timeout_s: float) -> dict | None:
    """Poll the run log for ``event`` (a GPU script: a poll is fine here)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = [e for e in _events(home) if e["event"] == event]
        if found:
            return found[0]
        time.sleep(0.5)
    return None


def _start(work: Path, name: str, seconds: float) -> tuple[Path, subprocess.Popen[str]]:
    home = work / f"home-{name}"
    job = work / "job.py"
    job.write_text(JOB)
    config = work / "c.toml"
    config.write_text("gpu_poll_s = 1.0\n")
    argv = [sys.executable, "-m", "dflashd.supervisor", "start", "--foreground", "--quiet"]
    argv += ["--home", str(home), "--config", str(config), "--", sys.executable, str(job)]
    argv.append(str(seconds))
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return home, proc


def intruder(work: Path) -> bool:
    home, daemon = _start(work, "intruder", 400)
    pace = _wait(home, "pace", 180)
    print("pace:", json.dumps(pace), flush=True)
    started = time.monotonic()
    other = subprocess.Popen([sys.executable, "-c", INTRUDER])
    slow = _wait(home, "slow", 120)
    detected = time.monotonic() - started
    other.kill()
    other.wait()
    over = _wait(home, "slow_over", 120)
    subprocess.run([sys.executable, "-m", "dflashd.supervisor", "stop", "--home", str(home)])
    daemon.wait(60)
    print("slow:", json.dumps(slow), flush=True)
    print("slow_over:", json.dumps(over), flush=True)
    print(f"detected {detected:.1f} s after the second process started", flush=True)
    named = slow is not None and any(
        f"pid {other.pid}" in c and "another process on GPU" in c for c in slow["causes"]
    )
    print(f"the second process named as the cause within 120 s: {named and detected <= 120}")
    print(f"the incident closed after it ended: {over is not None}")
    return named and detected <= 120 and over is not None


def clean(work: Path, seconds: float) -> bool:
    home, daemon = _start(work, "clean", seconds)
    code = daemon.wait(seconds + 240)
    events = _events(home)
    pace = [e for e in events if e["event"] == "pace"]
    steps = [e.get("step") for e in events if e["event"] == "progress"]
    false = [e for e in events if e["event"] in ("slow", "diverged")]
    print("pace:", json.dumps(pace[:1]), "last step:", steps[-1] if steps else None)
    print(f"clean {seconds:.0f} s run: daemon exit {code}, incidents {len(false)}: {false}")
    return code == 0 and bool(pace) and not false


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="dflashd-slow-gpu-"))
    case = sys.argv[1] if len(sys.argv) > 1 else "intruder"
    ok = intruder(work) if case == "intruder" else clean(work, float(sys.argv[2]))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
