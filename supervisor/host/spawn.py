"""Launching the child in its own session, and signalling what we started.

The child gets its own session (so its whole process group can be signalled), a parent
death signal (so a SIGKILLed daemon does not leave it holding the GPUs), pipes for
stdout and stderr, and the environment of docs/design.md ("Child protocol").
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from dflashd.logs.drain import grow_pipe
from dflashd.supervisor.host.cgroups import enter_cgroup_fd, open_procs_fd
from dflashd.supervisor.host.custody import die_with_parent
from dflashd.supervisor.host.proof import SpawnedChild

PR_SET_PDEATHSIG: Final = 1
# Variables systemd gives *us*; the child must get dflashd's NOTIFY_SOCKET, never systemd's.
_DAEMON_ONLY_ENV: Final = (
    "NOTIFY_SOCKET",
    "WATCHDOG_USEC",
    "WATCHDOG_PID",
    "LISTEN_FDS",
    "LISTEN_PID",
)

_libc = ctypes.CDLL(None, use_errno=True)
_prctl = _libc.prctl
_prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]


@dataclass(frozen=True, slots=True)
class ChildEnvironment:
    """Where the child's dflashd-owned state lives, and the mark that proves its processes ours."""

    notify_socket: Path
    cache_dir: Path
    run: int
    home: Path
    home_id: str = ""


def dflashd_env(spec: ChildEnvironment) -> dict[str, str]:
    """The variables dflashd sets for every child (their keys go into the ``spawn`` record)."""
    return {
        "NOTIFY_SOCKET": str(spec.notify_socket),
        "PYTHONUNBUFFERED": "1",
        "PYTHONFAULTHANDLER": "1",
        "DFLASHD_RUN": str(spec.run),
        "DFLASHD_HOME": str(spec.home),
        "DFLASHD_HOME_ID": spec.home_id,
        "TORCHINDUCTOR_CACHE_DIR": str(spec.cache_dir / "torchinductor"),
        "TRITON_CACHE_DIR": str(spec.cache_dir / "triton"),
        # TORCH_EXTENSIONS_DIR is left to torch's default (or the user's): JIT-built ops
        # (DeepSpeed's) take minutes to build and are shared by every home and run.
    }


# rich (Lightning's default bar when it is installed) draws its live bars only on a terminal;
# these make it draw them into the pipe too, so the steps are seen.  Defaults only: a value
# in dflashd's own environment or in the config's ``env`` wins ("0" turns it off).
LIVE_BARS_ENV: Final = {"TTY_COMPATIBLE": "1", "TTY_INTERACTIVE": "1"}


FLIGHT_FILE: Final = "TORCH_FR_DUMP_TEMP_FILE"


def flight_recorder_env(prefix: Path) -> dict[str, str]:
    """NCCL's flight recorder, on for every job unless the user set it: a collective timeout
    leaves each rank's trace at ``<prefix><rank>`` (under logs/flight/), listed in the exit
    record.  Harmless to jobs without torch.distributed."""
    return {
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        FLIGHT_FILE: str(prefix),
    }


def child_environ(
    base: Mapping[str, str],
    extra: Mapping[str, str],
    spec: ChildEnvironment,
    defaults: Mapping[str, str] = LIVE_BARS_ENV,
) -> dict[str, str]:
    """The child's environment: ``defaults``, ours minus systemd's daemon-only variables, then
    the config's, then dflashd's own."""
    env = dict(defaults)
    env.update({k: v for k, v in base.items() if k not in _DAEMON_ONLY_ENV})
    env.update(extra)
    env.update(dflashd_env(spec))
    return env


def _in_child(parent_pid: int, death_signal: int, procs_fd: int | None) -> None:
    """Runs between fork and exec: enter the run's cgroup, die with the daemon (even SIGKILLed)."""
    enter_cgroup_fd(procs_fd)()
    _prctl(PR_SET_PDEATHSIG, death_signal, 0, 0, 0)
    die_with_parent(parent_pid, death_signal)  # the daemon died before prctl took effect


def spawn(
    argv: tuple[str, ...],
    *,
    cwd: Path,
    env: Mapping[str, str],
    death_signal: int = signal.SIGTERM,
    cgroup: Path | None = None,
) -> SpawnedChild:
    """Fork and exec ``argv`` (in ``cgroup`` when given); raises OSError when exec fails."""
    procs_fd = open_procs_fd(cgroup)
    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    grow_pipe(out_r)
    grow_pipe(err_r)
    parent = os.getpid()
    try:
        process = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=out_w,
            stderr=err_w,
            start_new_session=True,
            close_fds=True,
            preexec_fn=lambda: _in_child(parent, death_signal, procs_fd),  # noqa: PLW1509 (a write and prctl)
        )
    except BaseException:
        for fd in (out_r, err_r):
            os.close(fd)
        raise
    finally:
        os.close(out_w)
        os.close(err_w)
        if procs_fd is not None:
            os.close(procs_fd)
    return SpawnedChild(process.pid, out_r, err_r, process)


def set_child_subreaper() -> bool:
    """Make orphaned descendants ours to reap (PR_SET_CHILD_SUBREAPER); False where unsupported."""
    return int(_prctl(36, 1, 0, 0, 0)) == 0
