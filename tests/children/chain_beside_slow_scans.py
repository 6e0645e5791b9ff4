"""pidfd custody against a respawning chain on a host whose scans of /proc are slow.

Spawns ``respawn_chain.py PIDFILE`` as run 1 (pidfd mode, this process its subreaper), waits
for ten links, then makes every scan of /proc list the processes and read them 60 ms later
(a busy host of thousands of processes; a link lives 20 ms, so a scan misses it twice over),
ends the root and calls ``kill_all``.  Prints JSON: whether custody then says the run is
empty, and how many links were written after it (a live descendant is let go on until it
writes one; none alive, none can).  Ends what is left itself.

    python chain_beside_slow_scans.py PIDFILE
"""

import json
import os
import signal
import sys
import time
from pathlib import Path

os.environ["DFLASHD_CUSTODY"] = "pidfd"

from dflashd.supervisor.host import proof as proof_module
from dflashd.supervisor.host.groups import HostProcesses
from dflashd.supervisor.host.procfs import ProcStat, all_stats, child_pids, read_stat
from dflashd.supervisor.host.spawn import set_child_subreaper

PIDFILE = Path(sys.argv[1])
CHAIN = Path(__file__).with_name("respawn_chain.py")


def links() -> list[tuple[int, int]]:
    try:
        rows = [line.split() for line in PIDFILE.read_text().splitlines()]
    except FileNotFoundError:
        return []
    return [(int(row[0]), int(row[1])) for row in rows if len(row) == 2]


def slow_scan() -> dict[int, ProcStat]:
    names = [name for name in os.listdir("/proc") if name.isdigit()]
    time.sleep(0.06)  # the busy host's scan: listed now, read later
    return {st.pid: st for st in map(read_stat, map(int, names)) if st is not None}


def live_descendants() -> list[int]:
    """This process's descendants that are not zombies: a real scan of /proc, and our own
    children read after it (a link that exited as the scan read it left its successor, ours
    then, out of the scan: the race the custody fix is about)."""
    stats = all_stats()
    children = [read_stat(pid) for pid in child_pids(os.getpid()) or ()]
    ours = {os.getpid(), *(st.pid for st in children if st is not None and st.state != "Z")}
    grew = True
    while grew:
        grew = False
        for pid, st in stats.items():
            if st.ppid in ours and pid not in ours and st.state != "Z":
                ours.add(pid)
                grew = True
    return sorted(ours - {os.getpid()})


set_child_subreaper()
ops = HostProcesses("chain-home")
env = {**os.environ, "DFLASHD_HOME_ID": "chain-home", "DFLASHD_RUN": "1"}
child = ops.spawn((sys.executable, str(CHAIN), str(PIDFILE)), cwd=Path.cwd(), env=env, run_no=1)
custody = child.custody
assert custody is not None
deadline = time.monotonic() + 20
while len(links()) < 10 and time.monotonic() < deadline:
    time.sleep(0.05)  # the chain's own pace: a link every 20 ms
proof_module.all_stats = slow_scan  # type: ignore[attr-defined]
os.kill(child.pid, signal.SIGKILL)
os.waitpid(child.pid, 0)
custody.reaped()
custody.kill_all()
empty = custody.empty()
seen = len(links())
# This process is the chain's subreaper: a link still alive is one of its descendants, so the
# answer needs no window of time. None alive: none will write. One alive (let go on, if it was
# left stopped): it writes its next link within the chain's pace.
left = live_descendants()
for pid in left:
    os.kill(pid, signal.SIGCONT)
deadline = time.monotonic() + 5
while left and len(links()) == seen and time.monotonic() < deadline:
    time.sleep(0.02)  # the chain's own pace: a link every 20 ms
result = {"empty": empty, "grew": len(links()) - seen}
for _ in range(100):  # what is left, ours: stopped, then killed, until none is alive
    if not (left := live_descendants()):
        break
    for signum in (signal.SIGSTOP, signal.SIGKILL):
        for pid in left:
            os.kill(pid, signum)
print(json.dumps(result))
