"""The real NVML sampler and the trainer's GPU path (marker ``gpu``: skipped, visibly, without a GPU)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dflashd.supervisor.watch.nvml import NvmlSampler, join_with_tree

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: find tests/
from tests.helpers import daemon_argv

pytestmark = pytest.mark.gpu
HERE = Path(__file__).parent


def test_real_sampler_sees_a_2gib_child() -> None:
    """NVML (joined with the process tree) attributes ~2 GiB to a child that allocated 2 GiB."""
    sampler = NvmlSampler("all")
    baseline = {r.index: r.memory_used_mib or 0.0 for r in sampler.sample()}
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "alloc_child.py"), "2"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and "holding" in proc.stdout.readline()
        use = join_with_tree(sampler.sample(), {proc.pid}, baseline)
        assert use.total_mib is not None and use.total_mib >= 2048, use
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        sampler.close()


def test_four_threads_compile_flex_on_one_gpu_without_deadlock(tmp_path: Path) -> None:
    """Four worker threads on one GPU each compile flex under the lock and train (the research deadlocked without it)."""
    cmd = [
        sys.executable,
        "-m",
        "dflashd.trainer",
        "--workers",
        "4",
        "--steps",
        "20",
        "--log-every",
        "5",
        "--checkpoint-dir",
        str(tmp_path),
    ]
    started = time.monotonic()
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ})
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    backends = [line for line in result.stdout.splitlines() if line.startswith("compile_done")]
    assert len(backends) == 4
    assert all("attention_backend=flex_compiled" in line for line in backends), backends
    assert time.monotonic() - started < 600


def test_silent_busy_job_is_seen_training_from_nvml(tmp_path: Path) -> None:
    """A job that prints nothing and keeps the GPU busy: first step from the GPU, phase training."""
    from dflashd.logs import EventRecord, follow

    home = tmp_path / "home"
    config = tmp_path / "c.toml"
    config.write_text("gpu_busy_s = 5.0\ngpu_poll_s = 0.5\n")
    job = (
        "import torch\n"
        "a = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16)\n"
        "while True:\n"
        "    a = (a @ a).clamp_(-1, 1)\n"
    )
    argv = daemon_argv(home, config, [sys.executable, "-c", job])
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    try:
        found = None
        for record in follow(
            home / "logs", poll_s=0.2, should_stop=lambda: time.monotonic() > deadline
        ):
            if isinstance(record, EventRecord) and record.event == "first_step":
                found = record
                break
        assert found is not None and found.fields["source"] == "gpu"
    finally:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "dflashd.supervisor",
                "stop",
                "--home",
                str(home),
                "--timeout",
                "5",
            ],
            check=False,
            capture_output=True,
        )
        proc.wait(60)


def test_the_preflight_reads_every_gpu_and_a_healthy_one_passes() -> None:
    """Issue 51: the real NVML reads of every field for every GPU, quickly; a healthy GPU
    passes the pre-flight (tests/gpu/recovery_gpu.py prints the figures)."""
    from dflashd.supervisor.model.preflight import preflight

    sampler = NvmlSampler("all")
    try:
        began = time.monotonic()
        health = sampler.health()
        took = time.monotonic() - began
    finally:
        sampler.close()
    assert health and all(h.answers and h.uuid for h in health)
    assert took < 0.05 * len(health) + 0.05
    assert preflight(health, {}, {}, allowed=None, fallback=False).ok
