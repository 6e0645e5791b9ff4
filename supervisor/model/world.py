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

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from dflashd.supervisor.model.stacks import ProcessStacks

# A node's report older than this (by the reading node's clock) no longer counts: a node
# reports once a round (15 s) while it is suspect, so two rounds missed mean it moved on.
FRESH_S: Final = 60.0
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


@dataclass(frozen=True, slots=True)
class WorldHeard:
    """What the store said at one sample: every node's report (this node's included), how
    many nodes the world has, or why the store could not be read."""

    nodes: int
    reports: tuple[NodeReport, ...] = ()
    error: str | None = None


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
    """
    sites = [in_collective(p) for p in processes]
    if any(p.stacks.role.remote_peers for p in processes) and all(sites):
        ranks = sorted(p.stacks.role.rank for p in processes if p.stacks.role.rank is not None)
        world = max(p.stacks.role.world_size or 0 for p in processes)
        return f"rank(s) {ranks} of {world} wait in {sites[0]} for ranks on other nodes"
    outside = [w for p in processes for w in p.outside_waits]
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
) -> Share | None:
    """What this node shares at its next round: ``finding`` is (WAITING or WORKING, waited
    seconds, why), or None to only hear.  None when there is no store or no place in it."""
    if not endpoint or node is None or nodes is None or nodes < 2:
        return None
    state, waited_s, why = finding if finding is not None else ("", 0.0, "")
    space = f"dflashd/{job_id or 'none'}"
    return Share(endpoint, space, node, nodes, state, waited_s, why)


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
    }


def heard_from(answer: dict[str, object], nodes: int) -> WorldHeard:
    """The helper's answer as a :class:`WorldHeard` (a malformed report is left out)."""
    error = answer.get("error")
    if error is not None:
        return WorldHeard(nodes, error=str(error)[:300])
    reports: list[NodeReport] = []
    raw = answer.get("reports")
    for item in raw if isinstance(raw, list) else []:
        try:
            report = NodeReport(
                int(item["node"]),
                str(item["state"]),
                float(item["waited_s"]),
                str(item["why"])[:400],
                float(item["age_s"]),
            )
        except (KeyError, TypeError, ValueError):
            continue
        reports.append(report)
    return WorldHeard(nodes, tuple(reports))


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
