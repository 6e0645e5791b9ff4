"""A job whose steps are CPU work on one CPU: ``cpu_steps.py CPU [HOG_FILE]`` pins itself to CPU
and prints ``step N loss X`` after each step of about 8 ms of computing (calibrated at start),
for ever.  Another process on the same CPU makes each step wait for it.

With ``HOG_FILE``: while that file exists the job keeps three CPU hogs of its own on the same
CPU, at nice -10 where allowed (and ends them when it is removed).  They are the job's children,
in its cgroup: a hog the test started outside would meet the job's cgroup's fair share, not
the job, and slow it only as much as the machine's other load leaves room for."""

import os
import subprocess
import sys
import time

cpu = int(sys.argv[1])
hog_file = sys.argv[2] if len(sys.argv) > 2 else None
os.sched_setaffinity(0, {cpu})
HOG = (
    f"import os\nos.sched_setaffinity(0, {{{cpu}}})\n"
    "try:\n    os.setpriority(os.PRIO_PROCESS, 0, -10)\nexcept PermissionError:\n    pass\n"
    "while True:\n    pass\n"
)


def work(n: int) -> int:
    total = 0
    for i in range(n):
        total += i * i
    return total


n = 20000
while True:  # calibrate: about 8 ms of work per step
    t = time.process_time()
    work(n)
    if time.process_time() - t >= 0.008:
        break
    n *= 2
step = 0
hogs: list[subprocess.Popen[bytes]] = []
while True:
    work(n)
    step += 1
    print(f"step {step} loss {2.0 + (step % 7) * 0.01:.3f}", flush=True)
    if hog_file is not None and os.path.exists(hog_file) != bool(hogs):
        if hogs:
            for hog in hogs:
                hog.kill()
                hog.wait()
            hogs = []
        else:
            hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(3)]
