"""The daemon's stack dumps: of the live run on demand (``dflashd stacks``) and before every kill.

:meth:`StackDumps.start` finds the run's processes through its custody, labels them (agent,
worker rank, root), and dumps the Python ones with py-spy on a thread of its own: the loop
never waits.  The result comes back through the inbox (:class:`StacksTaken`);
:meth:`StackDumps.taken` writes the text to ``logs/stacks/run-N-<time>.txt`` (and the JSON
beside it), and the ``stacks`` record with the summary: each process's top frames and the odd
rank out.  Without py-spy (or where the host forbids reading another process's memory) the
dump says why, and an ending run falls back to faulthandler's SIGABRT dump.
"""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import orjson

from dflashd.supervisor.host.home import Home
from dflashd.supervisor.host.procfs import (
    CLK_TCK,
    environ_values,
    io_bytes,
    read_stat,
    thread_states,
)
from dflashd.supervisor.host.pyspy import dump_processes, find_py_spy, py_spy_version, role_of
from dflashd.supervisor.host.rdzvstore import share_and_hear
from dflashd.supervisor.host.waits import outside_waits
from dflashd.supervisor.model.hang import HangSampled
from dflashd.supervisor.model.judge import Sample
from dflashd.supervisor.model.stacks import (
    ProcessStacks,
    Role,
    StacksDump,
    StacksTaken,
    render_text,
    summary,
)
from dflashd.supervisor.model.world import (
    ProcessSample,
    Share,
    WorldHeard,
    heard_from,
    share_request,
)
from dflashd.supervisor.speak.recorder import Recorder
from dflashd.supervisor.watch.run import Run


class Dumper(Protocol):
    """What the live run's control needs of stack dumps (:class:`StackDumps`, or a test's double)."""

    @property
    def available(self) -> bool:
        """Dumps can be taken."""
        ...

    def tool(self) -> str:
        """What ``status`` says about the tool."""
        ...

    def next_id(self, run: Run) -> str:
        """The id the next dump of ``run`` will carry."""
        ...

    def start(
        self, run: Run, trigger: str, *, native: bool = False, dump_id: str | None = None
    ) -> str:
        """Start a dump of ``run``; its result comes back through the inbox."""
        ...

    def taken(self, message: StacksTaken, wall: float) -> tuple[dict[str, Any], str]:
        """Write a finished dump's files; returns its ``stacks`` record's fields and level."""
        ...

    def sample(self, run: Run, share: Share | None = None) -> None:
        """Take one hang sample of ``run``; it comes back through the inbox (HangSampled).
        ``share``: also share this node's finding through the job's store, and hear the rest."""
        ...


def is_python(pid: int) -> bool:
    """A Python process: its executable, or a library it mapped, is Python's."""
    try:
        if "python" in os.path.basename(os.readlink(f"/proc/{pid}/exe")):
            return True
        with open(f"/proc/{pid}/maps", "rb") as fh:
            return b"libpython" in fh.read()
    except OSError:
        return False


class StackDumps:
    """Dumps of the live run, one thread each; their files and records."""

    def __init__(
        self,
        home: Home,
        reporter: Recorder,
        post: Callable[[StacksTaken | HangSampled], None],
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.home, self.reporter, self.post = home, reporter, post
        self.monotonic = monotonic  # the daemon's clock: a sample's time is compared with steps
        # DFLASHD_STACKS=faulthandler: no py-spy (the fallback, as on a host without it)
        forced_off = os.environ.get("DFLASHD_STACKS") == "faulthandler"
        self.binary = None if forced_off else find_py_spy()
        self.version = py_spy_version(self.binary) if self.binary else None
        self.last_error: str | None = None
        self._ids = itertools.count(1)

    @property
    def available(self) -> bool:
        """py-spy is there and runs."""
        return self.version is not None

    def tool(self) -> str:
        """What ``status`` says: ``py-spy 0.4.3``, or why dumps are unavailable."""
        if self.binary is None and os.environ.get("DFLASHD_STACKS") == "faulthandler":
            return "unavailable: DFLASHD_STACKS=faulthandler"
        if self.binary is None:
            return "unavailable: py-spy not found (pip install py-spy)"
        if self.version is None:
            return f"unavailable: {self.binary} does not run"
        if self.last_error:
            return f"{self.version} (last dump failed: {self.last_error})"
        return self.version

    def next_id(self, run: Run) -> str:
        """The id the next dump of ``run`` will carry."""
        return f"{run.run_no}-{next(self._ids)}"

    def start(
        self, run: Run, trigger: str, *, native: bool = False, dump_id: str | None = None
    ) -> str:
        """Dump the run's Python processes on a thread; returns the dump's id."""
        dump_id = dump_id or self.next_id(run)
        custody = run.custody
        binary = self.binary
        method = "py-spy --native" if native else "py-spy"

        def work() -> None:
            started = time.monotonic()
            dump = StacksDump(run.run_no, trigger, method)
            if binary is None or self.version is None or custody is None:
                dump.error = self.tool() if custody is not None else "no live run"
            else:
                dump.processes = _dump_python(binary, run, sorted(custody.members()), native)
                if not dump.processes:
                    dump.error = "no Python process in the run"
                elif not dump.ok:
                    dump.error = next((p.error for p in dump.processes if p.error), "no stacks")
            dump.took_s = time.monotonic() - started
            self.post(StacksTaken(run.run_no, dump_id, dump))

        threading.Thread(target=work, name=f"dflashd-stacks-{dump_id}", daemon=True).start()
        return dump_id

    def sample(self, run: Run, share: Share | None = None) -> None:
        """A hang sample on a thread: every Python process's stacks (py-spy, non-blocking: the
        job is never paused), the bytes each wrote so far and its threads' states; with
        ``share``, then this node's finding shared and the other nodes' heard (model/world.py)."""
        custody, binary = run.custody, self.binary

        def work() -> None:
            started = time.monotonic()
            dump = StacksDump(run.run_no, "hang_sample", "py-spy")
            processes: list[ProcessSample] = []
            world: WorldHeard | None = None
            try:
                if binary is not None and custody is not None:
                    members = sorted(custody.members())
                    dump.processes = _dump_python(binary, run, members, False, with_locals=True)
                    dumped = {p.pid for p in dump.processes}
                    native = [
                        ProcessStacks(pid, Role("process"), error="not Python")
                        for pid in members
                        if pid not in dumped
                    ]
                    run_pids = set(members)
                    processes = [_process_sample(p, run_pids) for p in (*dump.processes, *native)]
                if share is not None:
                    world = _hear_world(share, dump.processes)
            finally:  # always posted: the decider waits for it
                dump.took_s = time.monotonic() - started
                sample = Sample(self.monotonic(), tuple(processes), world)
                self.post(HangSampled(run.run_no, sample, dump))

        threading.Thread(target=work, name=f"dflashd-hang-{run.run_no}", daemon=True).start()

    def taken(self, message: StacksTaken, wall: float) -> tuple[dict[str, Any], str]:
        """Write the dump's files; returns its ``stacks`` record's fields and log level (the
        record is the caller's effect)."""
        dump = message.dump
        fields: dict[str, Any] = {"dump_id": message.dump_id, **summary(dump)}
        self.last_error = None if dump.ok else dump.error
        if dump.ok:
            stamp = datetime.fromtimestamp(wall, UTC).strftime("%Y%m%dT%H%M%S")
            folder = self.home.logs / "stacks"
            base = folder / f"run-{dump.run_no}-{stamp}-{message.dump_id}"
            header = f"dflashd stacks: run {dump.run_no}, {dump.trigger}, {dump.method}, {stamp}Z"
            try:
                folder.mkdir(parents=True, exist_ok=True)
                text_path = base.with_suffix(".txt")
                _write(text_path, render_text(dump, header).encode())
                _write(
                    base.with_suffix(".json"),
                    orjson.dumps(_as_json(dump), option=orjson.OPT_INDENT_2),
                )
                fields["path"] = str(text_path)
            except OSError as exc:
                fields["file_error"] = f"{exc.strerror or exc}"
            self.reporter.stack_dump_written()
        level = "info" if dump.trigger == "command" else "warning"
        return fields, level


def _hear_world(share: Share, processes: list[ProcessStacks]) -> WorldHeard:
    """Share and hear through the job's store, under a worker's own Python (it has torch):
    the interpreter it was started as (a venv's ``bin/python``; ``/proc/PID/exe`` would
    name the base interpreter, without the venv), with its ``PYTHONPATH``."""
    for pid in [p.pid for p in processes if p.role.kind == "worker"]:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                python = fh.read().split(b"\0")[0].decode()
        except (OSError, UnicodeDecodeError):
            continue
        if not os.path.isabs(python) or not os.access(python, os.X_OK):
            try:
                python = os.readlink(f"/proc/{pid}/exe")
            except OSError:
                continue
        env = environ_values(pid, ("PYTHONPATH", "PYTHONHOME", "LD_LIBRARY_PATH"))
        answer = share_and_hear(share_request(share), python, env)
        return heard_from(answer, share.nodes, share.world)
    return WorldHeard(share.nodes, error="no worker's Python to reach the store with")


def _dump_python(
    binary: str, run: Run, members: list[int], native: bool, *, with_locals: bool = False
) -> list[ProcessStacks]:
    """py-spy's dump of the Python processes among ``members``, each labelled with its role."""
    custody = run.custody
    torchrun = run.facts.agent is not None
    roles = {pid: role_of(pid, run.pid, torchrun) for pid in members if is_python(pid)}
    resume = lambda pid: custody.signal_pid(pid, signal.SIGCONT) if custody else None  # noqa: E731
    return dump_processes(binary, roles, native, resume, with_locals)


def _process_sample(stacks: ProcessStacks, run_pids: set[int]) -> ProcessSample:
    pid = stacks.pid
    found = read_stat(pid)
    cpu = found.cpu_ticks / CLK_TCK if found is not None else None
    read, written = io_bytes(pid)
    judged = {t.tid for t in stacks.threads if not any(f.collective for f in t.frames)}
    outside = outside_waits(pid, run_pids, judged) if stacks.error is None else ()
    return ProcessSample(stacks, written, thread_states(pid), cpu, read, outside)


def _write(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def _as_json(dump: StacksDump) -> dict[str, Any]:
    return {
        "run": dump.run_no,
        "trigger": dump.trigger,
        "method": dump.method,
        "took_s": round(dump.took_s, 3),
        "processes": [
            {
                "pid": p.pid,
                "role": p.role.label(),
                "rank": p.role.rank,
                "local_rank": p.role.local_rank,
                "error": p.error,
                "took_s": round(p.took_s, 3),
                "threads": [
                    {
                        "tid": t.tid,
                        "name": t.name,
                        "active": t.active,
                        "owns_gil": t.owns_gil,
                        "frames": [f.text() for f in t.frames],
                    }
                    for t in p.threads
                ],
            }
            for p in dump.processes
        ],
    }
