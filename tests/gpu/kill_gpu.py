"""Issue 51's kill row on a GPU, in one call: the same job SIGKILLed at step 150 under
``torchrun --max-restarts 3`` and under dflashd (no config), time from the kill to the next
training step (median of ``--runs``), and the job's own cold start split (python, ``import
torch``, CUDA's first context, the first step).

    python3 tests/gpu/kill_gpu.py [--runs 3]      (after tests/gpu/_env.sh)

The job is tests/gpu/hang_gpu.py's (~25 ms steps of 4096² matmuls, a checkpoint every 50
steps, resumed from it on a relaunch); only the process is killed, by its pid.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

JOB = r"""
import os, sys, time
t0 = time.time()
import torch
t1 = time.time()
dev = torch.device("cuda")
x = torch.randn(4096, 4096, device=dev)
w = torch.randn(4096, 4096, device=dev)
torch.cuda.synchronize()
t2 = time.time()
ckpt = os.path.join(sys.argv[1], "ckpt.pt")
start = torch.load(ckpt)["step"] if os.path.exists(ckpt) else 0
print(f"coldstart import_torch_s={t1 - t0:.3f} cuda_init_s={t2 - t1:.3f}", flush=True)
for step in range(start + 1, start + 2400):
    for _ in range(4):
        y = x @ w
    torch.cuda.synchronize()
    print(f"step {step} loss {float(y[0, 0]) % 1:.4f} t={time.time():.3f}", flush=True)
    if step % 50 == 0:
        torch.save({"step": step}, ckpt)
    if start > 0 and step >= start + 50:
        sys.exit(0)
"""


def _step_of(line: str) -> int | None:
    if line.startswith("step "):
        return int(line.split()[1])
    return None


def _printed_at(line: str) -> float:
    """The wall time the job printed the line at (its ``t=``): no pipe or echo delay counts."""
    return float(line.rsplit("t=", 1)[1])


def torchrun_case(work: Path) -> float:
    """torchrun, one worker: kill the worker at step 150, time to the next step line."""
    job = work / "job.py"
    job.write_text(JOB)
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1"]
    argv += ["--max-restarts", "3", "--monitor-interval", "0.1", str(job), str(work)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    import psutil

    killed_at = None
    relaunched = False
    assert proc.stdout is not None
    for line in proc.stdout:
        text = line.strip().split("]:")[-1].strip()
        step = _step_of(text)
        if step is not None and killed_at is None and step >= 150:
            for child in psutil.Process(proc.pid).children(recursive=True):
                if "job.py" in " ".join(child.cmdline()):
                    os.kill(child.pid, signal.SIGKILL)
            killed_at = time.time()
        elif text.startswith("coldstart") and killed_at is not None:
            relaunched = True
        elif step is not None and relaunched and killed_at is not None:
            took = _printed_at(text) - killed_at
            proc.terminate()
            proc.wait(30)
            return took
    raise AssertionError("torchrun never stepped again")


def standby_gpu_mib(pid: int | None) -> float | None:
    """The GPU memory NVML lists for the standby's process (0.0: none at all)."""
    if pid is None:
        return None
    import pynvml

    pynvml.nvmlInit()
    try:
        used = 0.0
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if proc.pid == pid:
                    used += (proc.usedGpuMemory or 0) / 2**20
        return used
    finally:
        pynvml.nvmlShutdown()


STANDBY: dict[str, object] = {}


def dflashd_case(work: Path, warm: bool = False) -> tuple[float, str]:
    """dflashd: kill the child at step 150, time to the relaunch's next step (``warm``: with
    ``warm_standby = true``; the standby's GPU memory and RSS are read just before the kill)."""
    job = work / "job.py"
    job.write_text(JOB)
    home = work / "home"
    config = work / "c.toml"
    extra = "warm_standby = true\n" if warm else ""
    config.write_text(extra + "[restart]\nbackoff_initial_s = 0.0\n")
    argv = [sys.executable, "-m", "dflashd.supervisor", "start", "--foreground", "--raw"]
    argv += [
        "--home",
        str(home),
        "--config",
        str(config),
        "--",
        sys.executable,
        str(job),
        str(work),
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    killed_at = None
    cold = ""
    assert proc.stdout is not None
    for line in proc.stdout:
        text = line.strip()
        if text.startswith("coldstart") and killed_at is not None:
            cold = text
        step = _step_of(text)
        if step is not None and killed_at is None and step >= 150:
            status = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "dflashd.supervisor",
                    "status",
                    "--json",
                    "--home",
                    str(home),
                ],
                capture_output=True,
                text=True,
                check=False,
            )
            shown = json.loads(status.stdout)
            if warm and not (shown.get("standby") or {}).get("ready"):
                continue  # a job trains far longer than 4 s: the kill comes once it is ready
            pid = shown["child"]["pid"]
            if warm:
                standby = shown.get("standby") or {}
                STANDBY.update(standby, gpu_mib=standby_gpu_mib(standby.get("pid")))
            os.kill(pid, signal.SIGKILL)
            killed_at = time.time()
        elif step is not None and killed_at is not None and cold:
            took = _printed_at(text) - killed_at
            proc.wait(60)
            return took, cold
    raise AssertionError("dflashd never stepped again")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="dflashd-kill-gpu-"))
    found: dict[str, list[float]] = {"torchrun": [], "dflashd": [], "dflashd warm": []}
    for i in range(args.runs):
        for name, times in found.items():
            work = root / f"{name.replace(' ', '-')}-{i}"
            work.mkdir()
            if name == "torchrun":
                took = torchrun_case(work)
                print(f"{name} run {i}: kill -> next step {took:.2f} s", flush=True)
            else:
                took, cold = dflashd_case(work, warm=name.endswith("warm"))
                print(f"{name} run {i}: kill -> next step {took:.2f} s ({cold})", flush=True)
            times.append(took)
    t, d = statistics.median(found["torchrun"]), statistics.median(found["dflashd"])
    w = statistics.median(found["dflashd warm"])
    print(f"standby before the kill: {json.dumps(STANDBY)}")
    print("\n| | torchrun --max-restarts 3 | dflashd, cold | dflashd, warm_standby |")
    print("|---|---|---|---|")
    print(
        f"| kill -> next training step (median of {args.runs}) | {t:.2f} s | {d:.2f} s "
        f"({d / t:.2f}x) | {w:.2f} s ({w / t:.2f}x) |"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
