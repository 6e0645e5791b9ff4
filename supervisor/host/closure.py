"""The stop closure of pid and pidfd custody: a run's processes all stopped, however fast
they fork, so that one SIGKILL ends them all (a respawning setsid chain outran the old
snapshot-and-kill rounds under load).  Finding only: the signals are custody.py's.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Final

from dflashd.supervisor.host.procfs import ProcStat, all_stats, child_pids, read_stat
from dflashd.supervisor.host.proof import Member, ProvenSet, close_fd, pidfd_open

CLOSURE_ROUNDS: Final = 10_000  # each round stops at least one new process: a bound, not a wait


def stop_closure(
    found: dict[int, Member],
    proves: Callable[[ProcStat, dict[int, ProcStat]], bool],
    stop: Callable[[Iterable[Member]], None],
) -> dict[int, Member]:
    """Stop ``found`` (``stop``: custody's SIGSTOP) and every process they fork, until nothing
    new appears: the run's processes, all stopped, for one SIGKILL that nothing can outrun.

    Exact where the kernel lists children: a fork completes only if no signal is pending on
    the parent, so once its SIGSTOP is queued a member's children are final, and read then.
    A child whose parent exited meanwhile is reparented to us (the subreaper) before the
    parent is gone: our own children are read last, and taken when they prove the run's
    (its mark or the root's group: ``proves``).  Where the kernel does not list children,
    a scan of /proc by parent pid takes their place.
    """
    me = os.getpid()
    stopped: dict[int, Member] = {}
    frontier = dict(found)
    for _ in range(CLOSURE_ROUNDS):
        stop(frontier.values())  # SIGSTOP, sent by custody.py
        stopped.update(frontier)
        frontier = {}
        parents = {pid: m.start_ticks for pid, m in stopped.items()}
        for pid, child in _children_of([*parents, me]):
            if child in stopped or child in frontier:
                continue
            st = read_stat(child)
            if st is None or st.state == "Z":
                continue
            if pid == me and not proves(st, {}):
                continue  # ours but not the run's (an alert command, a helper)
            if pid != me and st.start_ticks < parents[pid]:
                continue
            fd = pidfd_open(child)
            if fd is None:
                continue
            again = read_stat(child)  # the pidfd is of the process proved, or we let go
            if again is None or again.start_ticks != st.start_ticks:
                close_fd(fd)
                continue
            frontier[child] = Member(child, st.start_ticks, fd, st.pgid)
        if not frontier:
            break
    return stopped


def _children_of(parents: list[int]) -> list[tuple[int, int]]:
    """(parent, child) for each parent, in the order given (ours last: see stop_closure)."""
    out: list[tuple[int, int]] = []
    for pid in parents:
        kids = child_pids(pid)
        if kids is None:  # no children lists: one scan by parent pid for them all
            wanted = set(parents)
            return [(st.ppid, c) for c, st in all_stats().items() if st.ppid in wanted]
        out.extend((pid, kid) for kid in sorted(kids))
    return out


def our_live_children(stats: dict[int, ProcStat], exclude: set[int]) -> list[ProcStat]:
    """Our live children, read now, but those in ``exclude`` or leading its groups (alert
    commands and their sessions).  From our children list, read after ``stats`` (a scan of
    /proc): the list is atomic where the scan is not, and a respawning chain's live link can
    be missing from the scan, never from it (no lists on this kernel: the scan's parents)."""
    me = os.getpid()
    ours = child_pids(me)
    if ours is None:
        ours = {pid for pid, st in stats.items() if st.ppid == me}
    found = [read_stat(pid) for pid in sorted(ours)]  # now: the scan's may predate an adoption
    return [
        st
        for st in found
        if st is not None
        and st.state != "Z"
        and st.ppid == me
        and st.pid not in exclude
        and st.pgid not in exclude
    ]


def adopted_members(proof: ProvenSet) -> dict[int, Member]:
    """Our live children (orphans adopted as subreaper) that are the run's: proven before, or
    proven and taken into ``proof`` now (one atomic read of our children list).

    Read after a scan of /proc found nothing, these are what that scan can miss: a scan lists
    /proc first and reads each process after, and a respawning chain whose links live shorter
    than a scan (a few ms a thousand processes) is gone from it twice, its listed link exited
    by the time it is read and the next one not yet listed.  Each link's parent has exited, so
    the live one is ours at every moment: returned as found, never confirmed by another scan
    (one as slow missed the chain again: a stop left it running on a host of ~500 processes,
    tests/faults/test_custody.py)."""
    found: dict[int, Member] = {}
    for pid in child_pids(os.getpid()) or ():
        st = read_stat(pid)
        if st is None or st.state == "Z":
            continue
        with proof.lock:
            member = proof.proven.get(pid)
            if member is not None and member.start_ticks == st.start_ticks:
                found[pid] = member
            elif member is None and proof.proves(st, {}) and proof.take(st):
                found[pid] = proof.proven[pid]
    return found
