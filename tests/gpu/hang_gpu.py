"""Issues 32 and 41 on a GPU: a frozen job is ended within 60 s of its last step with no config,
a kernel that never returns (the GPU 100 % busy, the job in ``synchronize``) is ended as
``gpu_spin`` within 120 s, and a 150 s evaluation at full GPU utilisation is never ended.  One
call, under 10 minutes:

    python3 tests/gpu/hang_gpu.py            (after tests/gpu/_env.sh, as run_gpu_checks.sh does)

The job (written here, ~25 ms a step of matmuls, a checkpoint every 50 steps) freezes at step
150 (spins or evaluates at step 600: a spin is judged against the power the GPU drew while the
job stepped, which takes a few GPU samples) (``freeze``: the main thread blocks on a lock while the GPU idles, as a dead data loader
does), spins in a kernel that never returns (``spin``: ``torch.cuda._sleep`` for hours, then
``synchronize``), or evaluates for 150 s at full utilisation with no output (``eval``), then
steps on.
Prints the issue's table row for dflashd with no config: the time from the last step to the
decision (``hung_after_s``), and from the kill to the relaunch's first step.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

JOB = r"""
import os, sys, threading, time
import torch
what = sys.argv[1]
dev = torch.device("cuda")
x = torch.randn(4096, 4096, device=dev)
w = torch.randn(4096, 4096, device=dev)
ckpt = os.path.join(sys.argv[2], "ckpt.pt")
start = 0
if os.path.exists(ckpt) and int(os.environ.get("DFLASHD_RUN", "1")) > 1:
    start = torch.load(ckpt)["step"]
for step in range(start + 1, start + 800):
    for _ in range(4):
        y = x @ w
    torch.cuda.synchronize()
    print(f"step {step} loss {float(y[0, 0]) % 1:.4f}", flush=True)
    if step % 50 == 0:
        torch.save({"step": step}, ckpt)
    if int(os.environ.get("DFLASHD_RUN", "1")) > 1 and step >= start + 100:
        sys.exit(0)
    if step == 150 and what == "freeze":
        lock = threading.Lock(); lock.acquire(); lock.acquire()
    if step == 600 and what == "spin":
        torch.cuda._sleep(1 << 50)  # a kernel that does not return (days at GPU clocks)
        torch.cuda.synchronize()
    if step == 600 and what == "eval":
        end = time.monotonic() + 150
        while time.monotonic() < end:
            for _ in range(20):
                y = x @ w
            torch.cuda.synchronize()
    if step == 250 and what == "freeze" or step == 700:
        sys.exit(0)
"""


def _events(home: Path) -> list[dict]:
    out = []
    for path in sorted((home / "logs").glob("dflashd.jsonl*")):
        if path.suffix in (".zst", ".gz"):
            continue
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if rec.get("src") == "dflashd":
                out.append(rec)
    return out


def run_case(what: str, work: Path) -> dict:
    home = work / f"home-{what}"
    job = work / "job.py"
    job.write_text(JOB)
    config = work / "c.toml"
    config.write_text("[restart]\nbackoff_initial_s = 0.0\n")
    argv = [sys.executable, "-m", "dflashd.supervisor", "start", "--foreground", "--quiet"]
    argv += ["--home", str(home), "--config", str(config), "--", sys.executable, str(job), what]
    argv.append(str(work))
    started = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=400, check=False)
    took = time.monotonic() - started
    events = _events(home)
    exits = [e for e in events if e["event"] == "exit"]
    ending = [e for e in events if e["event"] == "ending_run"]
    firsts = [e for e in events if e["event"] == "first_step"]
    out = {
        "case": what,
        "daemon_rc": proc.returncode,
        "wall_s": round(took, 1),
        "verdicts": [(e["verdict"], e["reason"]) for e in exits],
        "hung_after_s": exits[0].get("hung_after_s") if exits else None,
        "suspects": len([e for e in events if e["event"] == "hang_suspect"]),
        "checks": [e.get("why") for e in events if e["event"] == "hang_check"],
        "frames": ending[0].get("frames") if ending else None,
        "evidence": [e.get("evidence") for e in ending],
        "power_w": [
            [g.get("power_w") for g in e.get("gpus", [])] for e in events if e["event"] == "gpu"
        ][:12],
    }
    if ending and len(firsts) > 1:
        from datetime import datetime

        def ts(rec: dict) -> float:
            return datetime.strptime(rec["ts"], "%Y-%m-%dT%H:%M:%S.%fZ").timestamp()

        out["kill_to_next_step_s"] = round(ts(firsts[1]) - ts(ending[0]), 2)
    return out


def main() -> int:
    """Every case (``hang_gpu.py``), or those named (``hang_gpu.py spin eval``)."""
    work = Path(tempfile.mkdtemp(prefix="dflashd-hang-gpu-"))
    os.environ.pop("DFLASHD_STACKS", None)
    cases = sys.argv[1:] or ["freeze", "spin", "eval"]
    found = {}
    for case in cases:
        found[case] = run_case(case, work)
        print(json.dumps(found[case], indent=1), flush=True)
    ok = {}
    if "freeze" in found:
        freeze = found["freeze"]
        first = freeze["verdicts"][:1] == [("stalled", "hung")]
        ok["frozen job ended as hung within 60 s"] = first and (freeze["hung_after_s"] or 99) < 60
        print("\n| launcher | kill -> next step | hang noticed after |\n|---|---|---|")
        print(
            f"| dflashd, no config | {freeze.get('kill_to_next_step_s')} s | "
            f"{freeze['hung_after_s']} s |"
        )
    if "spin" in found:
        spin = found["spin"]
        ok["kernel that never returns ended as gpu_spin within 120 s"] = (
            spin["verdicts"][:1] == [("stalled", "hung")]
            and (spin["hung_after_s"] or 999) < 120
            and any("gpu_spin" in str(e) for e in spin["evidence"])
        )
    if "eval" in found:
        ok["150 s eval at full utilisation not ended"] = found["eval"]["verdicts"] == [
            ("completed", "exit_code_0")
        ]
    for what, good in ok.items():
        print(f"{what}: {good}")
    return 0 if all(ok.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
