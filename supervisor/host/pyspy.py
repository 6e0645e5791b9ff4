"""Running py-spy: one run's Python processes dumped in parallel, within a bound, never left stopped.

dflashd is the trainer's ancestor, so the kernel lets py-spy (its child) read the run's
memory with Yama's default ``ptrace_scope`` 1: nothing to grant under systemd.  The default
dump is non-blocking (``process_vm_readv`` only: the job is never paused); ``--native`` needs
py-spy to stop each process for the few tens of milliseconds of its unwind.  A process found
stopped after a dump that was not stopped before gets ``SIGCONT`` (through custody), even if
py-spy was killed at its bound.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

import orjson

from dflashd.supervisor.host.custody import end_own_child_session
from dflashd.supervisor.host.procfs import environ_values, read_stat
from dflashd.supervisor.model.stacks import ProcessStacks, Role, parse_pyspy
from dflashd.supervisor.model.world import world_of

PROCESS_BOUND_S: Final = 4.0  # one process's dump (py-spy is killed past it)
MAX_PARALLEL: Final = 8  # 8 processes dump at once: a node's workers within the 5 s bound
_ROLE_KEYS: Final = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "TORCHELASTIC_RUN_ID",
    "MASTER_ADDR",
    "MASTER_PORT",
)
RUNNING_DUMPS: set[int] = set()  # py-spy processes at work: the daemon's orphan reaper leaves them


def find_py_spy() -> str | None:
    """py-spy next to the interpreter dflashd runs on (a venv's bin), else on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    if beside.is_file():
        return str(beside)
    return shutil.which("py-spy")


def py_spy_version(binary: str) -> str | None:
    """``py-spy 0.4.3``, or None when it does not run."""
    try:
        done = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, timeout=5, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def role_of(pid: int, root_pid: int | None, torchrun: bool) -> Role:
    """A process's role in the job, from the environment it started with."""
    env = environ_values(pid, _ROLE_KEYS)
    rank, local = env.get("RANK"), env.get("LOCAL_RANK")
    if rank is not None and rank.isdigit():
        world, here = env.get("WORLD_SIZE"), env.get("LOCAL_WORLD_SIZE")
        group = env.get("GROUP_RANK")
        return Role(
            "worker",
            int(rank),
            int(local) if local and local.isdigit() else None,
            int(world) if world and world.isdigit() else None,
            int(here) if here and here.isdigit() else None,
            int(group) if group and group.isdigit() else None,
            world_of(
                env.get("MASTER_ADDR"), env.get("MASTER_PORT"), env.get("TORCHELASTIC_RUN_ID")
            ),
        )
    if pid == root_pid:
        return Role("agent" if torchrun else "root")
    return Role("process")


def _stopped(pid: int) -> bool:
    found = read_stat(pid)
    return found is not None and found.state in ("T", "t")


def dump_process(
    binary: str, pid: int, role: Role, native: bool, with_locals: bool = False
) -> ProcessStacks:
    """One process, bounded by ``PROCESS_BOUND_S``; ``with_locals``: its frames' local
    variables read too (kept only as a digest: a loop that moves changes them)."""
    argv = [binary, "dump", "--pid", str(pid), "--json"]
    argv.append("--native" if native else "--nonblocking")
    if with_locals and not native:
        argv.append("--locals")
    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
        )
    except OSError as exc:
        return ProcessStacks(pid, role, error=f"py-spy: {exc.strerror or exc}")
    RUNNING_DUMPS.add(proc.pid)
    try:
        out, err = proc.communicate(timeout=PROCESS_BOUND_S)
    except subprocess.TimeoutExpired:
        end_own_child_session(proc)
        proc.communicate()
        return ProcessStacks(pid, role, error=f"py-spy took more than {PROCESS_BOUND_S:.0f} s")
    finally:
        RUNNING_DUMPS.discard(proc.pid)
    took = time.monotonic() - started
    if proc.returncode != 0:
        lines = [ln for ln in err.decode("utf-8", "replace").splitlines() if ln.strip()]
        return ProcessStacks(pid, role, error=(lines[0] if lines else "py-spy failed")[:300])
    try:
        data = orjson.loads(out)
    except orjson.JSONDecodeError:
        return ProcessStacks(pid, role, error="py-spy printed no JSON")
    return parse_pyspy(pid, role, data, took)


def dump_processes(
    binary: str,
    roles: dict[int, Role],
    native: bool,
    resume: Callable[[int], object],
    with_locals: bool = False,
) -> list[ProcessStacks]:
    """Every process of ``roles`` at once (at most ``MAX_PARALLEL`` at a time).

    ``resume(pid)`` is called for a process found stopped after its dump that was running
    before it (py-spy killed while it held the process stopped, say).
    """
    if not roles:
        return []
    from concurrent.futures import (
        ThreadPoolExecutor,
    )  # only when dumping: the idle daemon stays small

    was_stopped = {pid: _stopped(pid) for pid in roles}
    # --native stops each process while its py-spy unwinds it: no more unwinds at once than
    # CPUs, or a process waits stopped for a CPU (8 at once on 2 cores: 190 ms, not 40).
    parallel = min(MAX_PARALLEL, len(roles), (os.cpu_count() or 1) if native else MAX_PARALLEL)
    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        futures = {
            pid: pool.submit(dump_process, binary, pid, role, native, with_locals)
            for pid, role in roles.items()
        }
        results = [futures[pid].result() for pid in sorted(roles)]
    for pid, before in was_stopped.items():
        if not before and _stopped(pid):
            resume(pid)
    return results
