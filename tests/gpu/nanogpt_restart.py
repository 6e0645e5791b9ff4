"""nanoGPT's warm restart on a GPU, phase by phase (issue 26): where the seconds from a SIGKILL
to the next training step go.

nanoGPT (train.py, model.py, configurator.py, config/train_shakespeare_char.py from
karpathy/nanoGPT, unmodified) lies in ``.bench/nanogpt`` (carried to the GPU machine, never
committed); its data is made up here (random characters in its own format: the start-up
does not care what the tokens mean).  It runs under dflashd with ``stable_after_s = 20``; after
40 s of training its process is SIGKILLed; dflashd says ``crashed`` and relaunches (with no
backoff: the run was stable).  Each run's start is split by the time its lines reach the log:

    launch -> "tokens per iteration"          interpreter, torch import, config
    -> "number of parameters"                  data meta, the model built on the CPU
    -> "num decayed parameter tensors"         model.to(cuda): the CUDA context, the weights
    -> "compiling the model"                   the optimizer
    -> "step 0:"                               compile (from the warm caches in run 2) + one eval
    -> "iter 0:"                               the first training step (backward compiled)

    python3 tests/gpu/nanogpt_restart.py
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: find tests/
from dflashd.logs import EventRecord, LineRecord, read_records
from dflashd.logs.records import parse_timestamp
from tests.helpers import cli_argv, daemon_argv

NANOGPT = Path(__file__).resolve().parents[2] / ".bench" / "nanogpt"
MARKS = (
    ("tokens per iteration", "interpreter + torch import + config"),
    ("number of parameters", "data meta + model on the CPU"),
    ("num decayed parameter tensors", "model.to(cuda): CUDA context + weights"),
    ("compiling the model", "optimizer"),
    ("step 0:", "compile (cache) + one eval"),
    ("iter 0:", "first training step"),
)


def make_data(work: Path) -> None:
    import numpy as np

    data = work / "data" / "shakespeare_char"
    data.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for name, size in (("train.bin", 1_000_000), ("val.bin", 100_000)):
        rng.integers(0, 65, size, dtype=np.uint16).tofile(data / name)
    chars = [chr(32 + i) for i in range(65)]
    meta = {
        "vocab_size": 65,
        "itos": dict(enumerate(chars)),
        "stoi": {c: i for i, c in enumerate(chars)},
    }
    (data / "meta.pkl").write_bytes(pickle.dumps(meta))


def status(home: Path) -> dict:
    done = subprocess.run(cli_argv(home, "status", "--json"), capture_output=True, text=True)
    return json.loads(done.stdout) if done.stdout.strip() else {}


def breakdown(home: Path, run: int) -> list[tuple[str, float]]:
    records = [r for r in read_records(home / "logs") if r.run == run]
    launched = next(r for r in records if isinstance(r, EventRecord) and r.event == "launched")
    at = parse_timestamp(launched.ts)
    out, last = [], at
    for text, label in MARKS:
        line = next(
            (r for r in records if isinstance(r, LineRecord) and r.line.startswith(text)), None
        )
        if line is None:
            out.append((label, float("nan")))
            continue
        t = parse_timestamp(line.ts)
        out.append((label, t - last))
        last = t
    out.append(("total: launch to the first step", last - at))
    return out


def main() -> int:
    work = Path(os.environ.get("WORK", "/tmp/nanogpt_restart"))
    work.mkdir(parents=True, exist_ok=True)
    for name in ("train.py", "model.py", "configurator.py"):
        (work / name).write_bytes((NANOGPT / name).read_bytes())
    (work / "config").mkdir(exist_ok=True)
    cfg = NANOGPT / "config" / "train_shakespeare_char.py"
    (work / "config" / cfg.name).write_bytes(cfg.read_bytes())
    make_data(work)
    home, config = work / "home", work / "d.toml"
    config.write_text(
        f'gpus = "all"\ncwd = "{work}"\n[restart]\nstable_after_s = 20.0\nruntime_retries = 3\n'
    )
    command = [sys.executable, "train.py", "config/train_shakespeare_char.py", "--eval_iters=1"]
    command += ["--max_iters=100000", "--lr_decay_iters=100000", "--log_interval=10"]
    daemon = subprocess.Popen(daemon_argv(home, config, command), stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and (status(home).get("step") or 0) < 10:
            time.sleep(1)  # the daemon's status from outside: no event to wait on
        time.sleep(40)  # 40 s of training: past stable_after_s
        pid = status(home).get("child_pid")
        killed_at = time.time()
        os.kill(int(pid), signal.SIGKILL)  # the trainer this script started, by its pid
        while time.monotonic() < deadline + 120 and (status(home).get("run") or 1) < 2:
            time.sleep(0.5)
        while time.monotonic() < deadline + 240:
            if any(
                isinstance(r, LineRecord) and r.run == 2 and r.line.startswith("iter 0:")
                for r in read_records(home / "logs")
            ):
                break
            time.sleep(1)
        events = [r for r in read_records(home / "logs") if isinstance(r, EventRecord)]
        exit1 = next(r for r in events if r.event == "exit" and r.run == 1)
        restart = next(r for r in events if r.event == "restart" and r.run == 1)
        launched2 = next(r for r in events if r.event == "launched" and r.run == 2)
        print(f"run 1 exit: {exit1.fields['verdict']} ({exit1.fields['reason']})")
        print(f"restart delay_s: {restart.fields['delay_s']}")
        print(f"SIGKILL -> exit record: {parse_timestamp(exit1.ts) - killed_at:.3f} s")
        print(f"SIGKILL -> run 2 launched: {parse_timestamp(launched2.ts) - killed_at:.3f} s")
        for run in (1, 2):
            print(f"\nrun {run} ({'cold caches' if run == 1 else 'warm caches'}):")
            for label, seconds in breakdown(home, run):
                print(f"  {label:42s} {seconds:8.3f} s")
        first2 = next(
            r
            for r in read_records(home / "logs")
            if isinstance(r, LineRecord) and r.run == 2 and r.line.startswith("iter 0:")
        )
        print(
            f"\nSIGKILL -> run 2's first training step: {parse_timestamp(first2.ts) - killed_at:.3f} s"
        )
    finally:
        subprocess.run(cli_argv(home, "stop", "--timeout", "10"), capture_output=True)
        daemon.wait(60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
