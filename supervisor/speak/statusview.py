"""The status contract: what ``dflashd status --json`` prints and state.json holds (docs/design.md, "Status").

:class:`StatusView` is the documented object; :func:`one_line` its brief form (systemd's
STATUS= line); :func:`write_state` replaces state.json atomically (temp file + rename) so
``status`` works with the daemon down; :func:`read_state` reads it back through
:func:`parse_state`, which keeps what is well-typed and drops the rest (a hand-edited or
corrupted file is input from outside: it must never crash ``start`` or ``status``).

This module sits low in the house: it imports nothing of dflashd but the never-raising
encoder (:mod:`dflashd.logs.safejson`) and the goodput contract (:mod:`~dflashd.supervisor.model.goodput`, pure).  The daemon's snapshot
(:mod:`dflashd.supervisor.snapshot`) fills it in.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, NotRequired, TypedDict

import orjson

from dflashd.logs.safejson import dumps_any
from dflashd.supervisor.model.goodput import GoodputView

_MAX_STATE_BYTES = 4 * 1024 * 1024


class ChildIdentity(TypedDict):
    """Enough to prove, after a daemon crash, that a process is the child this daemon ran."""

    pid: int
    create_time: float | None
    start_ticks: int | None  # since boot: unlike create_time, no wall clock (a step) in it
    boot_id: str | None


class LogStats(TypedDict):
    """The run log's counters."""

    records_written: int
    bytes_written: int
    records_dropped: int
    bytes_dropped: int
    last_error: str | None


class StatusView(TypedDict):
    """One JSON object; every key is always present (``null`` when unknown)."""

    state: str  # starting | running | backoff | stopping | stopped | fatal
    phase: str  # launching | warming_up | training | exited
    pid: int  # the daemon's
    child_pid: int | None
    run: int | None
    step: int | None
    step_source: str | None  # notify | pattern | gpu | a built-in format's name
    first_step_source: str | None
    loss: float | None  # the last finite loss the job logged
    loss_step: int | None  # the step it was logged at
    loss_unfinite: str | None  # the newest loss when it is not finite ("nan", "inf"), else null
    epoch: float | None  # epochs done, where the job's output says (a fraction where it can)
    child_status: str | None  # the child's last STATUS= (cleared when its run ends)
    last_line: str | None  # the job's last output line
    last_progress_age_s: float | None
    last_progress_at: float | None
    restarts: int  # all-time, across daemons
    restarts_by_verdict: dict[str, int]
    restarts_this_daemon: int
    last_exit: dict[str, Any] | None
    fatal_reason: str | None
    gpus: list[dict[str, Any]]
    gpu_checks: str
    gpu_method: str | None
    log: str
    home: str
    started_at: float
    uptime_s: float
    updated_at: float
    version: str
    command: list[str]
    cwd: str  # where the job runs (absolute)
    next_restart_in_s: float | None
    restart_held_until: str | None  # a rule holds the relaunch until this ("room on /ckpt")
    log_stats: LogStats
    node: str  # config "node", or the host name: this node's name in a larger job
    # the job this node belongs to and its rank: job, rank, scheduler ("slurm" or "torchrun"),
    # step (Slurm's); null when nothing placed it (watch/placement.py)
    placement: dict[str, Any] | None
    elastic: dict[str, Any] | None  # a torchrun job: its rendezvous and the restarts it handled
    custody: str  # how runs own their processes: "cgroup" or "pidfd"
    standby: dict[str, Any] | None  # the next run's waiting interpreter (warm_standby), or null
    stacks_tool: str  # "py-spy 0.4.3", or why live stack dumps are unavailable
    log_codec: str  # the log path's inner loops: "c", or "python" where the C build is missing
    stop_timeout_s: float  # restart.stop_timeout_s: what `dflashd stop` without --timeout waits
    last_alert: dict[str, Any] | None  # kind, reason, run, at, sinks: {name: {ok, detail} | None}
    goodput: GoodputView  # where the time went since the home's first start (goodput.py)
    # what the live run waits on: work elsewhere (model/world.py) or a start-up stuck in a
    # known wait (model/startup.py): on, since, frames, kind; stale_build_locks and a hint
    waiting: dict[str, Any] | None
    pace: dict[str, Any] | None  # the run's own step time and the recent one (issue 43)
    slow: dict[str, Any] | None  # the open slow incident: how slow, since when, the causes
    diverged: dict[str, Any] | None  # its loss diverged: at which step, the last good one
    checkpoint_advice: (
        dict[str, Any] | None
    )  # the interval that pays (an estimate; model/advice.py)
    # the live run's recovery from the failure before it: detection, teardown, warm or cold
    # start, redone steps (model/recoveries.py); null for a first run or a user's start
    recovery: dict[str, Any] | None
    child: NotRequired[ChildIdentity]  # present while a child lives


def one_line(view: StatusView) -> str:
    """``running run 3 training step 1200``: systemd's STATUS= line, ``status`` in brief."""
    if view["run"] is None:
        return view["state"]
    step = f" step {view['step']}" if view["step"] is not None else ""
    return f"{view['state']} run {view['run']} {view['phase']}{step}"


MAX_COUNT = 2**53  # a run, step or restart count beyond this is not a count (JSON's safe integers)


def _int(value: Any) -> int | None:
    """A well-typed count: an integer, not a bool, below :data:`MAX_COUNT` in size."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) < MAX_COUNT:
        return value
    return None


def parse_state(obj: Any) -> dict[str, Any]:
    """Keep only the well-typed parts of a state.json object; drop what is wrong, never raise.

    What a later daemon or ``status`` relies on is checked: ``run`` an integer,
    ``restarts_by_verdict`` a table of integers, ``last_exit`` an object, ``child`` an
    object with an integer pid, the strings strings.  Anything else is dropped.
    """
    if not isinstance(obj, dict):
        return {}
    out: dict[str, Any] = {}
    for key, value in obj.items():
        if not isinstance(key, str):
            continue
        out[key] = value
    run_no = _int(out.get("run"))
    if run_no is None or run_no < 0:
        out.pop("run", None)
    by_verdict = out.get("restarts_by_verdict")
    if isinstance(by_verdict, dict):
        out["restarts_by_verdict"] = {
            str(k): v for k, v in by_verdict.items() if _int(v) is not None and v >= 0
        }
    else:
        out.pop("restarts_by_verdict", None)
    for key in ("last_exit", "child", "log_stats", "goodput", "last_alert"):
        if key in out and not isinstance(out[key], dict):
            out.pop(key)
    child = out.get("child")
    if isinstance(child, dict) and _int(child.get("pid")) is None:
        out.pop("child")
    for key in ("state", "phase", "child_status", "log", "home", "gpu_checks", "fatal_reason"):
        if key in out and not isinstance(out[key], str):
            out.pop(key)
    for key in ("gpus", "command"):
        if key in out and not isinstance(out[key], list):
            out.pop(key)
    gpus = out.get("gpus")
    if isinstance(gpus, list):
        out["gpus"] = [g for g in gpus if isinstance(g, dict)]
    last_exit = out.get("last_exit")
    if isinstance(last_exit, dict) and not isinstance(last_exit.get("tail", []), list):
        last_exit["tail"] = []
    return out


def write_state(path: Path, state: dict[str, Any], dir_fd: int | None = None) -> None:
    """Replace ``path`` with ``state`` in one rename: a reader sees the old file or the new one.

    The temporary file is created exclusively and never through a symlink; the rename
    replaces whatever entry ``path`` is (a planted link included), never its target.  With
    ``dir_fd`` (the home held open) both live in that directory whatever its path names now.
    """
    if dir_fd is not None:
        name, tmp = path.name, f".{path.name}.{os.getpid()}.tmp"
    else:
        name, tmp = str(path), str(path.with_name(f".{path.name}.{os.getpid()}.tmp"))
    data = dumps_any(state, orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE)
    try:
        os.unlink(tmp, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, 0o600, dir_fd=dir_fd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
    os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def read_state(path: Path, dir_fd: int | None = None) -> dict[str, Any] | None:
    """The last state written, validated, or None when there is none (or it is unreadable).

    With ``dir_fd`` (the home held open) it is read in that directory, by name."""
    name = path.name if dir_fd is not None else path
    try:
        fd = os.open(
            name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd
        )
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as fh:
            raw = fh.read(_MAX_STATE_BYTES + 1)
    except OSError:
        return None
    if len(raw) > _MAX_STATE_BYTES:
        return None
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return parse_state(obj) if isinstance(obj, dict) else None
