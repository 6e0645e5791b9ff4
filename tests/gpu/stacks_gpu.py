"""Live stacks on a GPU (issue 25), in one go:

1. The bundled trainer under dflashd, its worker thread hung inside the CUDA runtime
   (``--inject hang_at_step:30``: a day-long spin kernel, then a synchronize).
   ``dflashd stacks --native`` shows the thread in the driver; the job is not stopped.
2. The NCCL flight recorder's cost on the step: the trainer under torchrun (an NCCL group,
   one all_reduce of the gradients per step), with and without the variables dflashd sets.

    python3 tests/gpu/stacks_gpu.py [hang|flight|all]    (prints everything; $OUT gets the dumps)
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: find tests/
from tests.helpers import cli_argv, daemon_argv

OUT = Path(os.environ.get("OUT", "/tmp"))
TRAINER = [sys.executable, "-m", "dflashd.trainer"]


def say(text: str) -> None:
    print(text, flush=True)


def status(home: Path) -> dict:
    done = subprocess.run(cli_argv(home, "status", "--json"), capture_output=True, text=True)
    return json.loads(done.stdout) if done.stdout.strip() else {}


def hung_worker(work: Path) -> None:
    home, config = work / "home-hang", work / "hang.toml"
    config.write_text('gpus = "all"\nstall_timeout_s = 900.0\n')
    command = [
        *TRAINER,
        "--steps",
        "2000",
        "--log-every",
        "5",
        "--checkpoint-dir",
        str(work / "ck"),
    ]
    command += ["--inject", "hang_at_step:30"]
    daemon = subprocess.Popen(daemon_argv(home, config, command), stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and (status(home).get("step") or 0) < 29:
            time.sleep(1)  # the daemon's status from outside: no event to wait on
        still, last = time.monotonic(), status(home).get("step")
        while time.monotonic() < deadline and time.monotonic() - still < 3:  # the hang: no step
            time.sleep(0.5)  # the daemon's status from outside: no event to wait on
            if (step := status(home).get("step")) != last:
                still, last = time.monotonic(), step
        say(f"status: step {status(home).get('step')}, phase {status(home).get('phase')}")
        for mode in ([], ["--native"]):
            started = time.monotonic()
            done = subprocess.run(
                cli_argv(home, "stacks", *mode), capture_output=True, text=True, timeout=60
            )
            took = time.monotonic() - started
            name = "stacks_native.txt" if mode else "stacks.txt"
            (OUT / name).write_text(done.stdout + done.stderr)
            say(f"\n== dflashd stacks {' '.join(mode)} (rc {done.returncode}, {took:.2f} s)")
            say(done.stdout[-6000:] + done.stderr[-2000:])
        pid = status(home).get("child_pid")
        state = Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] if pid else "?"
        say(f"the trainer after both dumps: state {state} (not T: never left stopped)")
    finally:
        subprocess.run(cli_argv(home, "stop", "--timeout", "5"), capture_output=True)
        daemon.wait(60)


def step_rate(env_extra: dict[str, str], work: Path, label: str) -> list[float]:
    env = {**os.environ, **env_extra}
    for key in (
        "TORCH_NCCL_TRACE_BUFFER_SIZE",
        "TORCH_NCCL_DUMP_ON_TIMEOUT",
        "TORCH_FR_DUMP_TEMP_FILE",
    ):
        if key not in env_extra:
            env.pop(key, None)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1"]
    command += ["-m", "dflashd.trainer", "--steps", "400", "--log-every", "50"]
    command += ["--checkpoint-dir", str(work / f"ck-{label}")]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    rates = [
        float(m.group(1).replace(",", "")) for m in re.finditer(r"tok/s ([\d,]+)", done.stdout)
    ]
    if done.returncode != 0:
        say(f"{label}: rc {done.returncode}: {done.stderr[-1500:]}")
    return rates[2:]  # after warm-up


def flight_recorder_cost(work: Path) -> None:
    on = {
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_FR_DUMP_TEMP_FILE": str(work / "fr-rank"),
    }
    results = {}
    for rep in range(2):
        for label, extra in (("off", {}), ("on", on)):
            rates = step_rate(extra, work, f"{label}{rep}")
            results.setdefault(label, []).extend(rates)
            say(f"flight recorder {label} (rep {rep}): tok/s {[round(r) for r in rates]}")
    off, onr = statistics.median(results["off"]), statistics.median(results["on"])
    say(f"\nflight recorder: median tok/s off {off:,.0f}, on {onr:,.0f}: on/off = {onr / off:.4f}")


def main() -> int:
    part = sys.argv[1] if len(sys.argv) > 1 else "all"  # hang | flight | all
    work = Path(os.environ.get("WORK", "/tmp/stacks_gpu"))
    work.mkdir(parents=True, exist_ok=True)
    if part in ("hang", "all"):
        hung_worker(work)
    if part in ("flight", "all"):
        flight_recorder_cost(work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
