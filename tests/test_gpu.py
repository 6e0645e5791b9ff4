"""GPU logic without a GPU: the pure join, and scripted samplers driving the real daemon."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from dflashd.supervisor.watch.nvml import GpuProcess, GpuReading, gpu_pids_of_run, join_with_tree
from tests.conftest import Daemon, child

Start = Callable[..., Daemon]


def test_join_matches_processes_of_the_tree() -> None:
    """Memory of the child's own pids counts; a stranger's does not."""
    readings = [GpuReading(0, 3000, 80000, 50, (GpuProcess(10, 2048), GpuProcess(99, 512)))]
    use = join_with_tree(readings, {10, 11}, {0: 600})
    assert use.method == "process" and use.per_gpu_mib == {0: 2048} and use.total_mib == 2048


def test_unknown_memory_is_not_zero() -> None:
    """usedGpuMemory None for our pid means unknown, never zero."""
    readings = [GpuReading(0, 3000, 80000, 50, (GpuProcess(10, None),))]
    assert join_with_tree(readings, {10}, {}).total_mib is None


def test_container_pids_fall_back_to_the_device_rise() -> None:
    """No pid matches although memory rose after launch: judge by the device against the baseline."""
    readings = [GpuReading(0, 4600, 80000, 90, (GpuProcess(4242, 4000),))]
    use = join_with_tree(readings, {10}, {0: 600})
    assert use.method == "device" and use.per_gpu_mib == {0: 4000}


def test_idle_gpu_with_driver_reservation_is_zero() -> None:
    """~600 MiB of driver reservation with no process is not the child's memory."""
    readings = [GpuReading(0, 615, 80000, 0, ())]
    assert join_with_tree(readings, {10}, {0: 615}).total_mib == 0


def test_gpu_pids_of_run_uses_the_process_group_and_parents() -> None:
    """A GPU pid counts as the run's when it is in the run's group or descends from its root; a stranger never."""
    import os

    grandchild = "import os, time; os.setsid(); print(os.getpid(), flush=True); time.sleep(30)"
    root = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time; "
            f"subprocess.Popen([sys.executable, '-c', {grandchild!r}]); time.sleep(30)",
        ],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    escaped = 0
    try:
        assert root.stdout is not None
        escaped = int(root.stdout.readline())  # left the group with setsid, still a descendant
        readings = [GpuReading(0, 1, 1, 0, (GpuProcess(escaped, 10), GpuProcess(stranger.pid, 10)))]
        mine = gpu_pids_of_run(readings, root.pid, set())
        assert escaped in mine and root.pid in mine and stranger.pid not in mine
        assert os.getpgid(escaped) != root.pid
    finally:
        if escaped:
            os.kill(escaped, 9)  # started by this test (through root), by pid
        for proc in (root, stranger):
            proc.kill()
            proc.wait()
        if root.stdout is not None:
            root.stdout.close()


def script(path: Path, steps: list[list[dict[str, object]]]) -> Path:
    """Write a scripted-sampler file (tests/scripted_daemon.py injects it into the daemon)."""
    path.write_text(json.dumps(steps))
    return path


GPU0 = {"index": 0, "memory_total_mib": 81559, "utilization_pct": 0}


def test_zero_vram_before_first_step_is_no_gpu_memory(start_daemon: Start, tmp_path: Path) -> None:
    """Alive past vram_grace_s with no GPU memory: gpu snapshot, stack dump, killed, no_gpu_memory."""
    gpu = script(tmp_path / "gpu.json", [[{**GPU0, "memory_used_mib": 615}]])
    daemon = start_daemon(child("hang.py"), gpu_script=gpu, gpu_poll_s=0.2, vram_grace_s=1.0)
    assert daemon.wait(30) == 4
    exit_rec = daemon.events("exit")[0]
    assert exit_rec.fields["verdict"] == "no_gpu_memory"
    assert daemon.events("gpu_snapshot")
    assert "wait_for_a_collective_that_never_comes" in daemon.stacks_text()


def test_memory_held_prevents_no_gpu_memory(start_daemon: Start, tmp_path: Path) -> None:
    """A child that holds GPU memory is not killed for zero VRAM; it ends by its own stall instead."""
    steps = [[{**GPU0, "memory_used_mib": 3000, "processes": [["child", 2400]]}]]
    gpu = script(tmp_path / "gpu.json", steps)
    daemon = start_daemon(
        child("hang.py"), gpu_script=gpu, gpu_poll_s=0.2, vram_grace_s=0.5, stall_timeout_s=2.0
    )
    assert daemon.wait(30) == 4
    assert daemon.events("exit")[0].fields["verdict"] == "stalled"
    gpu = daemon.events("gpu")[0]
    assert gpu.fields["gpus"][0]["child_memory_mib"] == 2400 and gpu.fields["method"] == "process"


def test_xid_79_makes_the_crash_a_hardware_verdict(start_daemon: Start, tmp_path: Path) -> None:
    """An XID 79 during the run is logged and becomes the exit's reason gpu_xid_79."""
    clean = [{**GPU0, "memory_used_mib": 3000, "processes": [["child", 2400]]}]
    steps = [
        clean,
        [{**clean[0], "xids": [79]}],
        clean,
    ]  # the first reading is the pre-launch baseline
    gpu = script(tmp_path / "gpu.json", steps)
    daemon = start_daemon(
        child("progress_then.py", "notify", "hang"),
        gpu_script=gpu,
        gpu_poll_s=0.1,
        stall_timeout_s=1.5,
        restart={"runtime_retries": 0},
    )
    daemon.wait(30)
    assert daemon.events("gpu_xid")[0].fields["xids"] == [79]
    exit_rec = daemon.events("exit")[0]
    assert exit_rec.fields["gpu_xids"] == [79]
    # The hang that followed is explained by the hardware: the reason names the XID.
    assert (exit_rec.fields["verdict"], exit_rec.fields["reason"]) == ("stalled", "gpu_xid_79")


def test_memory_never_released_is_named_and_waited_for(start_daemon: Start, tmp_path: Path) -> None:
    """After a death, the dead run's pid still shows memory: named, waited for up to the timeout, then relaunch."""
    steps = [[{**GPU0, "memory_used_mib": 3000, "processes": [["child", 2400]]}]]
    gpu = script(tmp_path / "gpu.json", steps)
    daemon = start_daemon(
        child("crash_early.py"),
        gpu_script=gpu,
        gpu_poll_s=0.1,
        gpu_release_timeout_s=0.5,
        restart={"early_retries": 1},
    )
    assert daemon.wait(30) == 4
    held = daemon.events("gpu_memory_held")[0]
    first_pid = daemon.events("launched")[0].fields["pid"]
    assert (
        held.fields["holders"][0]["pid"] == first_pid and held.fields["holders"][0]["mib"] == 2400
    )
    assert daemon.events("gpu_release_timeout")
    assert len(daemon.events("spawn")) == 2


def test_foreign_holder_is_named_never_killed(start_daemon: Start, tmp_path: Path) -> None:
    """A process that is not ours holds GPU memory: it is named in the log and left alone."""
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        steps = [[{**GPU0, "memory_used_mib": 5000, "processes": [[stranger.pid, 4000]]}]]
        gpu = script(tmp_path / "gpu.json", steps)
        daemon = start_daemon(
            child("crash_early.py"), gpu_script=gpu, gpu_poll_s=0.1, restart={"early_retries": 1}
        )
        assert daemon.wait(30) == 4
        holders = daemon.events("gpu_foreign_holder")[0].fields["holders"]
        assert holders[0]["pid"] == stranger.pid and "time.sleep" in holders[0]["cmd"]
        assert psutil.Process(stranger.pid).is_running() and stranger.poll() is None
        assert len(daemon.events("spawn")) == 2
    finally:
        stranger.kill()
        stranger.wait()


def test_without_nvml_gpu_checks_are_off_once(start_daemon: Start, home: Path) -> None:
    """No NVML on this machine: one gpu_checks_off record, and status says the checks are off."""
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("NVML works here: this test is for GPU-less machines")
    except Exception:
        pass
    daemon = start_daemon(child("exit_silent.py"), gpus="all", restart={"early_retries": 1})
    daemon.wait(30)
    off = daemon.events("gpu_checks_off")
    assert len(off) == 1 and "NVML" in off[0].fields["reason"]
    status = json.loads(
        subprocess.run(
            [sys.executable, "-m", "dflashd.supervisor", "status", "--home", str(home), "--json"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
    )
    assert status["gpu_checks"].startswith("off")
