"""Issue 51's whole table on a GPU, in one call: the same job hung (or SIGKILLed) at step 150
under each launcher, side by side, median of ``--runs``.

    python3 tests/gpu/peers_gpu.py [--runs 3] [--torchrun-cap 45]   (after tests/gpu/_env.sh, and
    python3 -m pip install --no-deps --target "$SITE" .whl/peers/*.whl for ft_launcher)

Launchers: ``torchrun --max-restarts 3``; NVIDIA's ``ft_launcher`` (nvidia-resiliency-ext, the
wheel in ``.whl/peers/``, as run_gpu_checks.sh installs it) with the job sending a heartbeat each
step (``RankMonitorClient``: the code a user adds for it), its heartbeat timeout 10 s and its
check interval 1 s (its defaults are 45 min and 5 s); dflashd with no config; dflashd with
``warm_standby = true``.  The job prints ``step N ... t=T pid=P`` (its own clock), saves a
checkpoint every 50 steps and resumes from it when relaunched; at step 150 its main thread
blocks on a lock while the GPU idles (``hang``), or at step 420 it is SIGKILLed by its pid
(``kill``: between two checkpoints, and late enough for a warm standby to be ready).

Measured, launcher-neutral: *decided* is the last step line to the hung process's death (read
from /proc every 10 ms); *next step* is the last step line to the relaunched process's first
step line.  torchrun has no hang detection: its hang run is capped (``--torchrun-cap``, 0 skips
it) and reads "never" when nothing happened within the cap.
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
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.gpu.hang_gpu import _events

JOB = r"""
import os, sys, threading, time
import torch
beat = None
if os.environ.get("PEER_HEARTBEAT"):
    from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient
    beat = RankMonitorClient()
    beat.init_workload_monitoring()
relaunched = int(os.environ.get("DFLASHD_RUN", "1")) > 1 or int(
    os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
dev = torch.device(os.environ.get("PEER_DEVICE", "cuda"))
n = int(os.environ.get("PEER_N", "4096"))
x = torch.randn(n, n, device=dev)
w = torch.randn(n, n, device=dev)
ckpt = os.path.join(sys.argv[1], "ckpt.pt")
start = torch.load(ckpt)["step"] if relaunched and os.path.exists(ckpt) else 0
for step in range(start + 1, start + 2400):
    for _ in range(4):
        y = x @ w
    if dev.type == "cuda":
        torch.cuda.synchronize()
    print(f"step {step} loss {float(y[0, 0]) % 1:.4f} t={time.time():.3f} pid={os.getpid()}",
          flush=True)
    if beat is not None:
        beat.send_heartbeat()
    if step % 50 == 0:
        torch.save({"step": step}, ckpt)
    if relaunched and step >= start + 50:
        sys.exit(0)
    if step == 150 and not relaunched and sys.argv[2] == "hang":
        lock = threading.Lock(); lock.acquire(); lock.acquire()
"""

# the kill comes between two checkpoints (one at 150 would cut its save short) and ~10 s into
# training, once a warm standby is ready (its imports take ~4 s)
KILL_AT = 420
HEARTBEAT_TIMEOUT_S = 10.0
CHECK_INTERVAL_S = 1.0


def _fields(line: str) -> dict[str, str] | None:
    """``step``, ``t`` and ``pid`` of a step line (any launcher's prefix before ``step``)."""
    at = line.find("step ")
    if at < 0 or " t=" not in line:
        return None
    words = line[at:].split()
    out = {"step": words[1]}
    for word in words[2:]:
        if "=" in word:
            key, _, value = word.partition("=")
            out[key] = value
    return out if "t" in out and "pid" in out else None


def _death_time(pid: int, done: threading.Event, found: dict[str, float]) -> None:
    """Poll /proc for ``pid`` gone or a zombie; note the wall time."""
    while not done.is_set():
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            state = "gone"
        if state in ("Z", "X", "gone"):
            found["died"] = time.time()
            return
        time.sleep(0.01)


def end_tree(pid: int, sig: int = signal.SIGKILL) -> None:
    """Signal the launcher and every process under it, by pid (torchrun puts its workers in
    sessions of their own, so one process group does not hold them)."""
    import psutil

    try:
        top = psutil.Process(pid)
        tree = [top, *top.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for proc in reversed(tree):
        try:
            proc.send_signal(sig)
        except psutil.NoSuchProcess:
            pass


def launcher_argv(name: str, job: Path, work: Path, what: str) -> tuple[list[str], dict[str, str]]:
    env = dict(os.environ)
    tail = [str(job), str(work), what]
    if name == "torchrun":
        argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1"]
        return [*argv, "--max-restarts", "3", "--monitor-interval", "0.1", *tail], env
    if name == "ft_launcher + heartbeat":
        env["PEER_HEARTBEAT"] = "1"
        argv = [sys.executable, "-m", "nvidia_resiliency_ext.fault_tolerance.launcher"]
        argv += ["--nproc-per-node", "1", "--max-restarts", "3", "--monitor-interval", "0.1"]
        argv += ["--ft-rank_heartbeat_timeout", str(HEARTBEAT_TIMEOUT_S)]
        argv += ["--ft-initial_rank_heartbeat_timeout", "120"]
        argv += ["--ft-workload_check_interval", str(CHECK_INTERVAL_S)]
        return argv + tail, env
    home = work / "home"
    argv = [sys.executable, "-m", "dflashd.supervisor", "start", "--foreground", "--raw"]
    argv += ["--home", str(home)]
    if name == "dflashd warm_standby":
        config = work / "c.toml"
        config.write_text("warm_standby = true\n")
        argv += ["--config", str(config)]
    return [*argv, "--", sys.executable, *tail], env


def spawn_starts(home: Path) -> list[str]:
    """The spawn records' ``start`` (warm or cold) and ``cold_because``, in order."""
    spawns = [rec for rec in _events(home) if rec["event"] == "spawn"]
    return [f"{r.get('start', '?')} {r.get('cold_because', '')}".strip() for r in spawns]


def one_case(name: str, what: str, work: Path, cap_s: float) -> dict[str, object]:
    """One launcher, one fault: the times (None where it never came)."""
    job = work / "job.py"
    job.write_text(JOB)
    argv, env = launcher_argv(name, job, work, what)
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )
    found: dict[str, float] = {}
    done = threading.Event()
    first_pid = 0
    last_t = 0.0

    def at_cap() -> None:
        found["capped"] = time.time()  # the cap's kill is no decision of the launcher's
        end_tree(proc.pid)

    timer = threading.Timer(cap_s, at_cap)
    timer.start()
    tail: list[str] = []
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            tail = ([*tail, line.rstrip()])[-20:]
            got = _fields(line)
            if got is None:
                continue
            pid, at = int(got["pid"]), float(got["t"])
            if not first_pid:
                first_pid = pid
            if pid == first_pid:
                last_t = at
                if what == "kill" and int(got["step"]) == KILL_AT and "died" not in found:
                    os.kill(pid, signal.SIGKILL)
                    found["died"] = time.time()
                elif what == "hang" and int(got["step"]) == 150 and "died" not in found:
                    threading.Thread(
                        target=_death_time, args=(pid, done, found), daemon=True
                    ).start()
            elif "next" not in found:
                found["next"] = at
                break
    finally:
        done.set()
        timer.cancel()
        end_tree(proc.pid, signal.SIGTERM)  # dflashd ends its job itself
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            end_tree(proc.pid)
            proc.wait()
    out: dict[str, object] = {"launcher": name, "fault": what}
    decided = "died" in found and found["died"] < found.get("capped", float("inf")) - 0.5
    out["decided_s"] = round(found["died"] - last_t, 2) if decided else None
    out["next_step_s"] = round(found["next"] - last_t, 2) if "next" in found else None
    if what == "kill" and "died" in found and "next" in found:
        out["kill_to_next_s"] = round(found["next"] - found["died"], 2)
    if name.startswith("dflashd"):
        out["spawns"] = spawn_starts(work / "home")
    if "next" not in found:
        out["tail"] = tail[-6:]
    return out


def _median(values: list[float | None]) -> str:
    real = [v for v in values if v is not None]
    if not real:
        return "never"
    text = f"{statistics.median(real):.1f} s"
    return text if len(real) == len(values) else f"{text} ({len(real)} of {len(values)})"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--torchrun-cap", type=float, default=45.0)
    parser.add_argument("--faults", nargs="*", default=["hang", "kill"])
    parser.add_argument(
        "--only", nargs="*", help="launchers to run (a trial on CPU: PEER_DEVICE=cpu)"
    )
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="dflashd-peers-gpu-"))
    names = ["torchrun", "ft_launcher + heartbeat", "dflashd", "dflashd warm_standby"]
    names = [n for n in names if not args.only or n in args.only]
    rows: dict[tuple[str, str], list[dict[str, object]]] = {}
    for i in range(args.runs):
        for what in args.faults:
            for name in names:
                if name == "torchrun" and what == "hang" and (i > 0 or not args.torchrun_cap):
                    continue  # no hang detection: one capped run shows it
                cap = args.torchrun_cap + 20 if name == "torchrun" and what == "hang" else 240
                work = root / f"{what}-{name.replace(' ', '_').replace('+', '')}-{i}"
                work.mkdir()
                got = one_case(name, what, work, cap)
                print(json.dumps(got), flush=True)
                rows.setdefault((name, what), []).append(got)
    print(f"\n| (median of {args.runs}) | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))

    def cells(what: str, key: str) -> str:
        return " | ".join(
            _median([r.get(key) for r in rows.get((n, what), [])])  # type: ignore[misc]
            if rows.get((n, what))
            else "—"
            for n in names
        )

    print(f"| kill -> next training step | {cells('kill', 'kill_to_next_s')} |")
    print(f"| hang -> decided | {cells('hang', 'decided_s')} |")
    print(f"| hang -> next training step | {cells('hang', 'next_step_s')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
