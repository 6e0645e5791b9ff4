"""GPU measurements in one go (run by tests/gpu/run_gpu_checks.sh on the GPU machine).

1. NVML sampler cost per poll, process-tree join included.
2. A 2 GiB child: memory seen, then SIGKILL -> memory released as NVML sees it.
3. Under the daemon: a child that never touches CUDA ends no_gpu_memory within vram_grace_s + 2 polls.
4. Under the daemon: a 2 GiB child that dies -> exit record -> memory released -> relaunch.
5. The trainer: 4 threads on one GPU (flex compiled in each); default GPU config unsupervised vs
   under dflashd (step-time ratio); compiled flex vs dense at the same size (tok/s, peak memory).
Writes a JSON summary to $OUT/gpu_checks.json when OUT is set.
"""

from __future__ import annotations

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dflashd.logs import EventRecord, read_records
from dflashd.logs.records import parse_timestamp
from dflashd.supervisor.watch.nvml import NvmlSampler, gpu_pids_of_run, join_with_tree

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: find tests/
from tests.helpers import daemon_argv

HERE = Path(__file__).parent
CHILDREN = HERE.parent / "children"
RESULTS: dict[str, Any] = {}


def say(text: str) -> None:
    print(text, flush=True)


def sampler_cost() -> None:
    sampler = NvmlSampler("all")
    # A 2 GiB child, so the join has a GPU process to attribute.
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "alloc_child.py"), "2"], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    proc.stdout.readline()
    costs, join_costs = [], []
    for _ in range(2000):
        t0 = time.perf_counter()
        readings = sampler.sample()
        t1 = time.perf_counter()
        join_with_tree(readings, gpu_pids_of_run(readings, proc.pid, set()), {})
        t2 = time.perf_counter()
        costs.append((t1 - t0) * 1000)
        join_costs.append((t2 - t0) * 1000)
    proc.kill()
    proc.wait()
    proc.stdout.close()
    gpus = len(sampler.sample())
    sampler.close()
    costs.sort()
    join_costs.sort()
    RESULTS["sampler"] = {
        "gpus": gpus,
        "nvml_median_ms": round(statistics.median(costs), 4),
        "nvml_p99_ms": round(costs[int(len(costs) * 0.99)], 4),
        "with_join_median_ms": round(statistics.median(join_costs), 4),
        "with_join_p99_ms": round(join_costs[int(len(join_costs) * 0.99)], 4),
        "per_gpu_with_join_median_ms": round(statistics.median(join_costs) / gpus, 4),
    }
    say(f"sampler: {RESULTS['sampler']}")


def release_timing() -> None:
    sampler = NvmlSampler("all")
    baseline = {r.index: r.memory_used_mib or 0.0 for r in sampler.sample()}
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "alloc_child.py"), "2"], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    proc.stdout.readline()
    use = join_with_tree(sampler.sample(), {proc.pid}, baseline)
    pids_listed = [p.pid for r in sampler.sample() for p in r.processes]
    killed = time.perf_counter()
    proc.send_signal(signal.SIGKILL)
    released = None
    while time.perf_counter() - killed < 30:
        readings = sampler.sample()
        used = sum(r.memory_used_mib or 0.0 for r in readings)
        if used - sum(baseline.values()) < 256 and not any(
            p.pid == proc.pid for r in readings for p in r.processes
        ):
            released = time.perf_counter() - killed
            break
        time.sleep(0.001)
    proc.wait()
    sampler.close()
    RESULTS["release"] = {
        "child_mib": use.total_mib,
        "method": use.method,
        "child_pid": proc.pid,
        "nvml_pids": pids_listed,
        "released_after_kill_ms": None if released is None else round(released * 1000, 1),
    }
    say(f"2 GiB child: {RESULTS['release']}")


def start_daemon(home: Path, command: list[str], **config: Any) -> subprocess.Popen[bytes]:
    lines = []
    restart = config.pop("restart", {})
    for key, value in config.items():
        lines.append(f"{key} = {json.dumps(value)}")
    lines.append("[restart]")
    lines += [f"{k} = {json.dumps(v)}" for k, v in restart.items()]
    cfg = home.with_suffix(".toml")
    cfg.write_text("\n".join(lines) + "\n")
    argv = daemon_argv(home, cfg, list(command), flags=())
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def events(home: Path) -> list[EventRecord]:
    return [r for r in read_records(home / "logs") if isinstance(r, EventRecord)]


def no_gpu_memory(work: Path) -> None:
    home = work / "nogpu"
    grace, poll = 5.0, 1.0
    daemon = start_daemon(
        home,
        [sys.executable, str(CHILDREN / "hang.py")],
        gpus="all",
        vram_grace_s=grace,
        gpu_poll_s=poll,
        restart={"early_retries": 0},
    )
    daemon.wait(60)
    evs = events(home)
    launched = next(e for e in evs if e.event == "launched")
    exit_rec = next(e for e in evs if e.event == "exit")
    took = parse_timestamp(exit_rec.ts) - parse_timestamp(launched.ts)
    RESULTS["no_gpu_memory"] = {
        "verdict": exit_rec.fields["verdict"],
        "launch_to_exit_s": round(took, 2),
        "limit_s": grace + 2 * poll,
        "within_limit": took <= grace + 2 * poll,
        "gpu_checks": [e.fields for e in evs if e.event == "gpu_checks_off"],
    }
    say(f"never touches CUDA: {RESULTS['no_gpu_memory']}")


def relaunch_timing(work: Path) -> None:
    home = work / "relaunch"
    daemon = start_daemon(
        home,
        [sys.executable, str(HERE / "alloc_child.py"), "2", "die"],
        gpus="all",
        gpu_poll_s=0.2,
        restart={"early_retries": 0, "runtime_retries": 1, "backoff_initial_s": 0.0},
    )
    daemon.wait(120)
    evs = events(home)
    exits = [e for e in evs if e.event == "exit"]
    launches = [e for e in evs if e.event == "launched"]
    gpu_events = [e for e in evs if e.event.startswith("gpu_memory")]
    first_exit = parse_timestamp(exits[0].ts)
    second_launch = parse_timestamp(launches[1].ts) if len(launches) > 1 else None
    gpu_records = [e.fields for e in evs if e.event == "gpu"]
    RESULTS["relaunch"] = {
        "verdicts": [e.fields["verdict"] for e in exits],
        "exit_to_relaunch_s": None
        if second_launch is None
        else round(second_launch - first_exit, 3),
        "gpu_memory_events": [(e.event, e.fields) for e in gpu_events],
        "child_memory_seen_mib": [g["gpus"][0].get("child_memory_mib") for g in gpu_records][:4],
        "method": [g.get("method") for g in gpu_records][:4],
    }
    say(f"relaunch after a 2 GiB child died: {RESULTS['relaunch']}")


STEP_RE = re.compile(
    r"^step (\d+)/\d+ loss ([\d.]+) acc [\d.]+ tok/s ([\d,]+) lr \S+(?: mem ([\d,]+)MiB)?"
)


def parse_trainer(lines: list[str]) -> dict[str, Any]:
    steps = []
    out: dict[str, Any] = {"compile": [], "first_step_s": None}
    for line in lines:
        m = STEP_RE.match(line)
        if m:
            steps.append(
                (
                    int(m.group(1)),
                    float(m.group(2)),
                    float(m.group(3).replace(",", "")),
                    float((m.group(4) or "0").replace(",", "")),
                )
            )
        elif line.startswith("compile_done"):
            out["compile"].append(line)
        elif line.startswith("first_step"):
            out["first_step_s"] = float(line.split("secs_since_start=")[1].split()[0])
    steady = [s[2] for s in steps[len(steps) // 2 :]]
    out["tok_s_steady_median"] = statistics.median(steady) if steady else None
    out["peak_mem_mib"] = max((s[3] for s in steps), default=None)
    out["loss_first_last"] = (steps[0][1], steps[-1][1]) if steps else None
    return out


def trainer_runs(work: Path) -> None:
    base = [sys.executable, "-m", "dflashd.trainer"]
    runs: dict[str, Any] = {}

    def plain(name: str, extra: list[str]) -> None:
        ck = work / f"ck-{name}"
        started = time.monotonic()
        result = subprocess.run(
            [*base, *extra, "--checkpoint-dir", str(ck)],
            capture_output=True,
            text=True,
            timeout=420,
        )
        info = parse_trainer(result.stdout.splitlines())
        info.update(returncode=result.returncode, wall_s=round(time.monotonic() - started, 1))
        if result.returncode != 0:
            info["stderr_tail"] = result.stderr.splitlines()[-8:]
        runs[name] = info
        say(f"trainer {name}: {json.dumps(info)[:1500]}")

    plain("threads4_one_gpu", ["--workers", "4", "--steps", "40", "--log-every", "10"])
    plain("default_gpu_unsupervised", ["--steps", "200", "--log-every", "20"])
    plain(
        "dense_same_size",
        ["--steps", "60", "--log-every", "10", "--attention", "dense", "--no-require-flex"],
    )
    home = work / "supervised"
    ck = work / "ck-supervised"
    started = time.monotonic()
    daemon = start_daemon(
        home,
        [*base, "--steps", "200", "--log-every", "20", "--checkpoint-dir", str(ck)],
        gpus="all",
        gpu_poll_s=2.0,
        restart={"early_retries": 0},
    )
    daemon.wait(420)
    lines = [r.line for r in read_records(home / "logs") if hasattr(r, "line")]
    info = parse_trainer(lines)
    info["wall_s"] = round(time.monotonic() - started, 1)
    info["verdict"] = [e.fields["verdict"] for e in events(home) if e.event == "exit"]
    info["first_step_event"] = [e.fields for e in events(home) if e.event == "first_step"]
    runs["default_gpu_supervised"] = info
    say(f"trainer supervised: {json.dumps(info)[:1500]}")
    unsup = runs["default_gpu_unsupervised"].get("tok_s_steady_median")
    sup = info.get("tok_s_steady_median")
    if unsup and sup:
        runs["supervised_over_unsupervised_step_time"] = round(unsup / sup, 4)
    dense = runs["dense_same_size"]
    if unsup and dense.get("tok_s_steady_median"):
        runs["flex_over_dense_tok_s"] = round(unsup / dense["tok_s_steady_median"], 3)
    RESULTS["trainer"] = runs


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="dflashd-gpu-"))
    for step in (sampler_cost, release_timing):
        try:
            step()
        except Exception as exc:
            RESULTS[step.__name__] = f"FAILED: {exc!r}"
            say(f"{step.__name__} FAILED: {exc!r}")
    for step2 in (no_gpu_memory, relaunch_timing, trainer_runs):
        try:
            step2(work)
        except Exception as exc:
            RESULTS[step2.__name__] = f"FAILED: {exc!r}"
            say(f"{step2.__name__} FAILED: {exc!r}")
    out = os.environ.get("OUT")
    if out:
        Path(out, "gpu_checks.json").write_text(json.dumps(RESULTS, indent=2, default=str))
    say(json.dumps(RESULTS, indent=2, default=str))


if __name__ == "__main__":
    main()
