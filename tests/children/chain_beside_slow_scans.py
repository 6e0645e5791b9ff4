"""pidfd custody against a respawning chain on a host whose scans of /proc are slow.

Spawns ``respawn_chain.py PIDFILE`` as run 1 (pidfd mode, this process its subreaper), waits
for ten links, then makes every scan of /proc list the processes and read them 60 ms later
(a busy host of thousands of processes; a link lives 20 ms, so a scan misses it twice over),
ends the root and calls ``kill_all``.  Prints JSON: whether custody then says the run is
empty, and how many links were written in the 0.3 s after it.  Ends what is left itself.

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
from dflashd.supervisor.host.procfs import ProcStat, read_stat
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
time.sleep(0.3)  # a window of 15 links: a surviving link would write some
grew = len(links()) - seen
result = {"empty": empty, "grew": grew}
count = len(links())
for _ in range(100):  # what is left, ended by its pid and start ticks: never left running
    alive = [(p, s) for p, s in links()[-5:] if (st := read_stat(p)) and st.start_ticks == s]
    if not alive and len(links()) == count:
        break
    for pid, _start in alive:
        os.kill(pid, signal.SIGKILL)
    count = len(links())
    time.sleep(0.05)
print(json.dumps(result))
