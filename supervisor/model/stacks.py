"""Live stacks, the pure part: py-spy's JSON in, a labelled dump, its summary and its text out.

A dump holds, per Python process of the run, its role (the torchrun agent, a worker with its
``RANK``/``LOCAL_RANK``, or the job's root) and every thread with its frames, innermost first.
:func:`odd_ranks` answers the question users ask first of a hung job: which rank is not where
the others are.  No process is touched here (:mod:`pyspy` runs the tool).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Final

TOP_FRAMES: Final = 3  # frames of each main thread in the summary and the alert
WAITING_THREADS: Final = 8  # per process, in the stacks record and a hang alert
MAX_ALERT_LINES: Final = 40  # a hang alert's frames: every process and thread, capped
# A frame of a collective: the rank waits for its peers.  torch.distributed's Python layer by
# file; native frames by name (NCCL, gloo, c10d's process groups); a bare collective's name.
_COLLECTIVE_FILE: Final = re.compile(r"torch/distributed/|libnccl|libtorch_cuda_nccl")
_COLLECTIVE_NAME: Final = re.compile(
    r"^(?:all_reduce|allreduce|all_gather\w*|reduce_scatter\w*|broadcast|barrier|all_to_all\w*)\b"
    r"|nccl|gloo::|c10d::|ProcessGroup",
    re.IGNORECASE,
)


@dataclass(frozen=True, slots=True)
class StackFrame:
    """One frame: the function, its file (short) and line (0 for a native frame)."""

    name: str
    file: str
    line: int

    def text(self) -> str:
        """``backward (torch/autograd/graph.py:744)``, or ``cudaStreamSynchronize (libcudart.so)``."""
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{self.name} ({where})"

    @property
    def collective(self) -> bool:
        """A frame of a collective (all_reduce, barrier, an NCCL or gloo wait...)."""
        return bool(_COLLECTIVE_FILE.search(self.file) or _COLLECTIVE_NAME.search(self.name))


@dataclass(frozen=True, slots=True)
class ThreadStack:
    """One thread of one process, frames innermost first."""

    tid: int
    name: str
    active: bool
    owns_gil: bool
    frames: tuple[StackFrame, ...]
    # a digest of its frames' local variables (py-spy --locals; 0: none read): a loop whose
    # frames look the same from sample to sample still changes its loop variable
    locals_key: int = 0


@dataclass(frozen=True, slots=True)
class Role:
    """What a process is in the job."""

    kind: str  # "agent" (torchrun), "worker" (has RANK), "root" (the job), "process"
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None  # WORLD_SIZE: every rank of the job, on every node
    local_world_size: int | None = None  # LOCAL_WORLD_SIZE: the ranks on this node
    group_rank: int | None = None  # GROUP_RANK: this node's rank among the job's nodes
    world: str | None = None  # the rendezvous round it belongs to (model/world.py's world_of)

    @property
    def remote_peers(self) -> bool:
        """The job's world reaches beyond this node (ranks this node cannot see)."""
        world, local = self.world_size, self.local_world_size
        return world is not None and local is not None and world > local

    def label(self) -> str:
        """``worker rank 1 (local 1)``, ``agent``, ``root``."""
        if self.kind == "worker" and self.rank is not None:
            local = f" (local {self.local_rank})" if self.local_rank is not None else ""
            return f"worker rank {self.rank}{local}"
        return self.kind


@dataclass(frozen=True, slots=True)
class ProcessStacks:
    """One Python process's dump, or why there is none."""

    pid: int
    role: Role
    threads: tuple[ThreadStack, ...] = ()
    error: str | None = None
    took_s: float = 0.0

    @property
    def main(self) -> ThreadStack | None:
        """The main thread (its tid is the pid), else the first thread."""
        for thread in self.threads:
            if thread.tid == self.pid:
                return thread
        return self.threads[0] if self.threads else None

    def top(self, count: int = TOP_FRAMES) -> list[str]:
        """The main thread's innermost named frames, as text (a native frame py-spy could
        only give an address for says nothing to the person paged)."""
        return _top(self.main, count)

    def active_threads(self, limit: int = 4) -> dict[str, list[str]]:
        """Other threads py-spy saw running (a worker thread stuck in a CUDA synchronize, say):
        name -> top frames.  One trainer thread per GPU is where a threaded job hangs."""
        main = self.main
        busy = [t for t in self.threads if t.active and t is not main and t.frames]
        return {t.name: _top(t, TOP_FRAMES) for t in busy[:limit]}

    def waiting_threads(self, limit: int = WAITING_THREADS) -> dict[str, list[str]]:
        """The other threads that wait (a lock, a queue, a collective): name -> top frames.
        A hang alert names each (issue 54: the root thread alone said little)."""
        main = self.main
        idle = [t for t in self.threads if not t.active and t is not main and t.frames]
        return {f"{t.name or t.tid}": _top(t, 2) for t in idle[:limit]}


def _top(thread: ThreadStack | None, count: int) -> list[str]:
    if thread is None:
        return []
    named = [f for f in thread.frames if not f.name.startswith("0x")] or list(thread.frames)
    return [f.text() for f in named[:count]]


@dataclass
class StacksDump:
    """A whole run's dump."""

    run_no: int
    trigger: str  # "command", or why dflashd is about to end the run
    method: str  # "py-spy", "py-spy --native"
    processes: list[ProcessStacks] = field(default_factory=list)
    took_s: float = 0.0
    error: str | None = None  # the dump as a whole failed (py-spy missing, not permitted)

    @property
    def ok(self) -> bool:
        """At least one process was dumped."""
        return any(p.threads for p in self.processes)


@dataclass(frozen=True, slots=True)
class StacksTaken:
    """From a dump thread to the loop: a finished dump."""

    run_no: int
    dump_id: str
    dump: StacksDump


def parse_pyspy(pid: int, role: Role, data: Any, took_s: float) -> ProcessStacks:
    """``py-spy dump --json`` output for one process."""
    threads: list[ThreadStack] = []
    for raw in data if isinstance(data, list) else []:
        if not isinstance(raw, dict):
            continue
        tid = raw.get("os_thread_id") or raw.get("thread_id") or 0
        name = raw.get("thread_name") or ("MainThread" if tid == pid else f"thread {tid}")
        frames = tuple(
            StackFrame(
                str(f.get("name") or "?"),
                str(f.get("short_filename") or f.get("filename") or "?"),
                int(f.get("line") or 0),
            )
            for f in raw.get("frames") or []
            if isinstance(f, dict)
        )
        values = tuple(
            (str(v.get("name")), str(v.get("repr")))
            for f in raw.get("frames") or []
            if isinstance(f, dict)
            for v in f.get("locals") or []
            if isinstance(v, dict)
        )
        active, gil = bool(raw.get("active")), bool(raw.get("owns_gil"))
        key = hash(values) if values else 0
        threads.append(ThreadStack(int(tid), str(name), active, gil, frames, key))
    return ProcessStacks(pid, role, tuple(threads), took_s=took_s)


def _site(process: ProcessStacks) -> str:
    """Where a process's main thread is: its innermost Python-level frame (native frames and
    the innermost collective collapsed, so two ranks in all_reduce compare equal)."""
    main = process.main
    if main is None or not main.frames:
        return "?"
    for frame in main.frames:
        if frame.collective:
            return f"collective {frame.name}"
    python = [f for f in main.frames if f.line] or list(main.frames)
    return python[0].text()


def in_collective(process: ProcessStacks) -> bool:
    """The main thread waits in a collective."""
    main = process.main
    return main is not None and any(f.collective for f in main.frames)


def odd_ranks(processes: list[ProcessStacks]) -> list[ProcessStacks]:
    """The workers not where the others are.

    With three or more ranks, the ranks outside the one place most of them share.  With two
    (or a tie), the ranks outside a collective while the others wait in one: those are the
    ranks the others wait for.  Empty when all agree, or when nothing can be said.
    """
    ranks = [p for p in processes if p.role.kind == "worker" and p.threads]
    if len(ranks) < 2:
        return []
    sites = Counter(_site(p) for p in ranks)
    if len(sites) == 1:
        return []
    (first, first_count), (_, second_count) = sites.most_common(2)
    if first_count > second_count and first_count >= len(ranks) / 2:
        return [p for p in ranks if _site(p) != first]
    waiting = [p for p in ranks if in_collective(p)]
    if waiting and len(waiting) < len(ranks):
        return [p for p in ranks if not in_collective(p)]
    return []


def summary(dump: StacksDump) -> dict[str, Any]:
    """The ``stacks`` record's fields beside the file: each process's role and top frames, and
    the odd rank out."""
    odd = odd_ranks(dump.processes)
    processes = [
        {
            "pid": p.pid,
            "role": p.role.label(),
            "rank": p.role.rank,
            "threads": len(p.threads),
            "top": p.top(),
            **({"active_threads": active} if (active := p.active_threads()) else {}),
            **({"waiting_threads": waits} if (waits := p.waiting_threads()) else {}),
            **({"error": p.error} if p.error else {}),
        }
        for p in dump.processes
    ]
    out: dict[str, Any] = {
        "trigger": dump.trigger,
        "method": dump.method,
        "took_s": round(dump.took_s, 3),
        "processes": processes,
        "odd_rank_out": [p.role.rank for p in odd] or None,
    }
    if odd:
        where = "; ".join(f"rank {p.role.rank} in {_site(p)}" for p in odd)
        others = [p for p in dump.processes if p.role.kind == "worker" and p not in odd]
        theirs = _site(others[0]) if others else "?"
        out["odd_summary"] = f"{where}; the other ranks in {theirs}"
    if dump.error:
        out["error"] = dump.error
    return out


def alert_lines(fields: dict[str, Any], limit: int = 16) -> list[str]:
    """The top frames of each process's main thread, one line each, for an alert: the job's
    own processes (agent, ranks, root) first; helpers (a compiler's worker pool) only when
    there is room."""
    processes = [p for p in fields.get("processes") or [] if isinstance(p, dict)]
    own = [p for p in processes if p.get("role") != "process"]
    helpers = [p for p in processes if p.get("role") == "process"]
    lines: list[str] = []
    for p in (own + helpers)[:limit]:
        lines.append(f"{p.get('role')} pid {p.get('pid')}: " + " <- ".join(p.get("top") or ["?"]))
        active = p.get("active_threads")
        active = active if isinstance(active, dict) else {}
        lines.extend(f"  thread {name}: " + " <- ".join(top) for name, top in active.items())
        waits = p.get("waiting_threads")
        waits = waits if isinstance(waits, dict) else {}
        lines.extend(
            f"  thread {name} (waiting): " + " <- ".join(top) for name, top in waits.items()
        )
    if len(lines) > MAX_ALERT_LINES:
        lines = [*lines[:MAX_ALERT_LINES], "... more threads in the dump file"]
    if len(processes) > limit:
        lines.append(f"... and {len(processes) - limit} more processes (see the dump file)")
    if fields.get("odd_summary"):
        lines.insert(0, f"odd rank out: {fields['odd_summary']}")
    return lines


def render_text(dump: StacksDump, header: str) -> str:
    """The dump as a person reads it (the file under logs/stacks/, and ``dflashd stacks``)."""
    out = [header]
    fields = summary(dump)
    if fields.get("odd_summary"):
        out.append(f"odd rank out: {fields['odd_summary']}")
    if dump.error:
        out.append(f"no dump: {dump.error}")
    for process in dump.processes:
        out.append("")
        took = f", {process.took_s * 1000:.0f} ms" if process.took_s else ""
        out.append(f"== pid {process.pid}: {process.role.label()}{took}")
        if process.error:
            out.append(f"   (no stacks: {process.error})")
        for thread in process.threads:
            state = "active" if thread.active else "idle"
            gil = ", holds the GIL" if thread.owns_gil else ""
            out.append(f'   Thread {thread.tid} "{thread.name}" ({state}{gil})')
            out.extend(f"       {frame.text()}" for frame in thread.frames)
    return "\n".join(out) + "\n"
