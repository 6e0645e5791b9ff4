"""A job judged as a whole: waits on work elsewhere, and what the other nodes say (pure).

One node sees only its own ranks.  When every judged thread here waits in a collective and
the job's world reaches beyond this node, the work it waits for happens elsewhere: this node
never ends the run from its own evidence (:func:`waits_elsewhere`).  The same holds for a
wait whose other end lives outside the run (a lock a sibling job holds, a pipe it fills).

Only the world as a whole can tell a lost collective (every rank of every node waits, for
ever) from a peer's long computation.  Each node's dflashd shares its finding through the
rendezvous store the job already runs (``host/rdzvstore.py``, a helper under the job's own
Python: the daemon never imports torch), and :func:`world_stuck` reads what every node said:
the run is stuck only when *every* node of the world reported that all its ranks wait, each
for at least ``remote_wait_s``, recently.  A node that works, a node that said nothing
(stepping, or not under dflashd) or a stale report keeps everyone waiting.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from dflashd.supervisor.model.stacks import ProcessStacks

# A node's report older than this (by the reading node's clock) no longer counts: a node
# reports once a round (15 s) while it is suspect, so two rounds missed mean it moved on.
FRESH_S: Final = 60.0
# A report dated this far ahead of the reader's clock is not evidence (a writer's clock that
# is wrong, or a value that is not a node's): it would stay "fresh" for ever.  Clocks of one
# cluster agree within milliseconds under NTP; seconds of skew are still read as fresh now.
FUTURE_S: Final = 10.0
MAX_WAITED_S: Final = 30 * 86400.0  # a wait longer than a month is not a value a node wrote
WAITING: Final = "waiting"
WORKING: Final = "working"


@dataclass(frozen=True, slots=True)
class NodeReport:
    """What one node's dflashd last shared: its finding and how long it has held."""

    node: int  # the node's group rank (torchrun's GROUP_RANK)
    state: str  # WAITING (every rank waits on work elsewhere) or WORKING
    waited_s: float  # how long it had been waiting when it wrote (0 when working)
    why: str  # the wait in words: which collective, which ranks
    age_s: float  # how long ago it wrote, by the reader's clock
    world: str | None = None  # the round it judged (:func:`world_of`); another round's is stale


@dataclass(frozen=True, slots=True)
class WorldHeard:
    """What the store said at one sample: every node's report (this node's included), how
    many nodes the world has, or why the store could not be read."""

    nodes: int
    reports: tuple[NodeReport, ...] = ()
    error: str | None = None
    left_out: int = 0  # values in dflashd's keys that were not a node's report of this round


@dataclass(frozen=True, slots=True)
class Share:
    """What this node shares at the next sample, and where (the loop builds it, the sample
    thread runs the helper): the store's ``host:port``, the key space, this node's rank."""

    endpoint: str
    key_space: str
    node: int
    nodes: int
    state: str
    waited_s: float
    why: str
    world: str | None = None  # this round's identity (:func:`world_of`)


@dataclass(frozen=True, slots=True)
class ProcessSample:
    """One process at one moment: its stacks, the bytes it wrote so far, its threads' states."""

    stacks: ProcessStacks
    wrote_bytes: int | None = None  # /proc/PID/io wchar (None: unreadable)
    thread_states: tuple[str, ...] = ()  # /proc/PID/task/*/stat states (R, S, D, ...)
    cpu_s: float | None = None  # CPU time used so far (all its threads, native ones included)
    read_bytes: int | None = None  # /proc/PID/io rchar (a stream from a slow server is work)
    # waits whose other end is outside the run: a file lock another process holds, a pipe
    # only others write (host/waits.py), each said in words
    outside_waits: tuple[str, ...] = ()

    def signature(self) -> tuple[tuple[int, tuple[str, ...]], ...]:
        """Each thread's frames, by thread id: two samples whose signatures are equal did not
        move (the hang judge's and the quick look's test)."""
        threads = sorted(self.stacks.threads, key=lambda t: t.tid)
        return tuple((t.tid, tuple(f.text() for f in t.frames)) for t in threads)


def in_collective(process: ProcessSample) -> str | None:
    """The collective frame one of the process's threads waits in, if any."""
    for thread in process.stacks.threads:
        for frame in thread.frames:
            if frame.collective:
                return frame.text()
    return None


def waits_elsewhere(processes: Sequence[ProcessSample]) -> str | None:
    """Why a round that looks hung on this node is not this node's to end (None: it is).

    - The job's world reaches beyond this node (``WORLD_SIZE`` > ``LOCAL_WORLD_SIZE``) and
      every rank here waits in a collective: the ranks it waits for run elsewhere (rank 0
      evaluating or saving while the others sit in ``barrier``).  A rank here waiting in its
      own code while its peers wait in collectives is the culprit: that stays a hang.
    - A process waits on a file lock or a pipe whose other end lives outside the run (a
      sibling job holding the lock, a producer filling a FIFO): that end's work is not ours.
    - A process is stopped by a signal: whoever stopped it resumes it (a traced stop, ``t``,
      is not one: py-spy's own reads may show it).
    """
    sites = [in_collective(p) for p in processes]
    if any(p.stacks.role.remote_peers for p in processes) and all(sites):
        ranks = sorted(p.stacks.role.rank for p in processes if p.stacks.role.rank is not None)
        world = max(p.stacks.role.world_size or 0 for p in processes)
        return f"rank(s) {ranks} of {world} wait in {sites[0]} for ranks on other nodes"
    outside = [w for p in processes for w in p.outside_waits]
    # a process stopped by a signal (every thread in T: SIGSTOP, SIGTSTP) was paused by
    # someone outside the job (an operator, a frozen rendezvous host); SIGCONT resumes it
    outside += [
        f"pid {p.stacks.pid} is stopped by a signal (SIGSTOP): paused from outside the job"
        for p in processes
        if p.thread_states and all(state == "T" for state in p.thread_states)
    ]
    return "; ".join(outside[:3]) if outside else None


def someone_works(heard: WorldHeard | None) -> bool:
    """A node said, recently, that its ranks work: the wait here is for that work."""
    if heard is None:
        return False
    return any(r.state == WORKING and r.age_s <= FRESH_S for r in heard.reports)


def world_decides(heard: WorldHeard | None) -> bool:
    """Every node of the world reported, recently: the store will tell a stuck world from a
    working one (no ``waiting`` alert needed; a stuck world is ended, with its own alert)."""
    if heard is None or heard.error is not None or heard.nodes < 2:
        return False
    fresh = {r.node for r in heard.reports if r.age_s <= FRESH_S}
    return fresh >= set(range(heard.nodes))


def world_stuck(
    heard: WorldHeard | None, node: int | None, waited_s: float, remote_wait_s: float
) -> str | None:
    """The world is stuck (every node's ranks wait on each other): the reason, else None.

    ``node``/``waited_s``: this node, and how long its own rounds have found it waiting.
    Every node of the world must have a fresh report saying it waits, and every one of them
    (this one included) must have waited ``remote_wait_s``.
    """
    if heard is None or heard.error is not None or node is None or heard.nodes < 2:
        return None
    if waited_s < remote_wait_s:
        return None
    latest = {r.node: r for r in heard.reports}
    others = [latest.get(n) for n in range(heard.nodes) if n != node]
    for report in others:
        if report is None or report.state != WAITING or report.age_s > FRESH_S:
            return None
        if report.waited_s + report.age_s < remote_wait_s:
            return None
    waits = sorted({r.why for r in others if r is not None})
    return (
        f"every node of the world waits (all {heard.nodes} for {remote_wait_s:.0f}s or more): "
        + "; ".join(waits[:3])
    )


def share_of(
    endpoint: str | None,
    job_id: str | None,
    node: int | None,
    nodes: int | None,
    finding: tuple[str, float, str] | None,
    world: str | None = None,
) -> Share | None:
    """What this node shares at its next round: ``finding`` is (WAITING or WORKING, waited
    seconds, why), or None to only hear.  None when there is no store or no place in it."""
    if not endpoint or node is None or nodes is None or nodes < 2:
        return None
    state, waited_s, why = finding if finding is not None else ("", 0.0, "")
    space = f"dflashd/{job_id or 'none'}"
    return Share(endpoint, space, node, nodes, state, waited_s, why, world)


def world_of(master: str | None, port: str | None, run_id: str | None) -> str | None:
    """One round of one job: the workers' ``MASTER_ADDR:MASTER_PORT`` (torchrun's agents
    agree on it at each rendezvous, a new round picks a new one) and ``TORCHELASTIC_RUN_ID``.
    Keys left by an earlier round or run, or by another job sharing the store under the same
    rendezvous id, name another world: never evidence about this one."""
    if not master or not port:
        return None
    return f"{master}:{port}/{run_id or ''}"[:300]


def share_request(share: Share) -> dict[str, object]:
    """The store helper's request (host/rdzvstore.py)."""
    return {
        "endpoint": share.endpoint,
        "key_space": share.key_space,
        "node": share.node,
        "nodes": share.nodes,
        "state": share.state,
        "waited_s": round(share.waited_s, 3),
        "why": share.why[:400],
        "world": share.world,
    }


def heard_from(answer: dict[str, object], nodes: int, world: str | None = None) -> WorldHeard:
    """The helper's answer as a :class:`WorldHeard`.  The store is evidence, not truth: a
    report is kept only when it is a node's of this world (``world``: this round's identity;
    another round's, run's or job's is left out), names a node of it, says a known state,
    carries finite numbers in range, and is not dated ahead of this clock; each report left
    out is counted (a world with one gone is never judged stuck: every node must speak)."""
    error = answer.get("error")
    if error is not None:
        return WorldHeard(nodes, error=str(error)[:300])
    reports: list[NodeReport] = []
    raw = answer.get("reports")
    items = raw if isinstance(raw, list) else []
    skipped = answer.get("skipped")
    left_out = skipped if isinstance(skipped, int) and not isinstance(skipped, bool) else 0
    for item in items:
        report = _report(item, nodes, world)
        if report is None:
            left_out += 1
        else:
            reports.append(report)
    return WorldHeard(nodes, tuple(reports), left_out=max(0, left_out))


def _report(item: object, nodes: int, world: str | None) -> NodeReport | None:
    """One node's report, validated (None: not evidence about this world)."""
    if not isinstance(item, dict):
        return None
    node, state, why = item.get("node"), item.get("state"), item.get("why")
    written = item.get("world")
    if not isinstance(node, int) or isinstance(node, bool) or not 0 <= node < nodes:
        return None
    if state not in (WAITING, WORKING) or not isinstance(why, str):
        return None
    if written != world:  # another round's, run's or job's (or none): not this world's
        return None
    waited, age = _finite(item.get("waited_s")), _finite(item.get("age_s"))
    if waited is None or age is None or not 0.0 <= waited <= MAX_WAITED_S or age < -FUTURE_S:
        return None
    return NodeReport(node, state, waited, why[:400], max(0.0, age), written)


def _finite(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def world_summary(heard: WorldHeard | None) -> str | None:
    """What the store said, in words, for the ``hang_check`` record (None: not asked)."""
    if heard is None:
        return None
    if heard.error is not None:
        return f"the rendezvous store could not be read: {heard.error}"
    said = ", ".join(
        f"node {r.node} {r.state}" + (f" {r.waited_s + r.age_s:.0f}s" if r.state == WAITING else "")
        for r in sorted(heard.reports, key=lambda r: r.node)
    )
    return f"{len(heard.reports)} of {heard.nodes} nodes reported" + (f": {said}" if said else "")
