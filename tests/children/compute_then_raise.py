"""Works silently (no step line) until it has used CPU_S seconds of CPU, then fails as told.

argv: cpu_s own|inductor
- ``own``: raises ValueError from this file (the job's own code);
- ``inductor``: prints a traceback whose last frame is in torch/_inductor, and exits 1.
CPU time, not wall time: the same work however busy the machine is.  A relaunch exits 0.
"""

import os
import sys
import time

cpu_s, how = float(sys.argv[1]), sys.argv[2]
if int(os.environ.get("DFLASHD_RUN", "1")) > 1:
    print("relaunched", flush=True)
    sys.exit(0)
print("loading the data", flush=True)
total = 0
while time.process_time() < cpu_s:
    for i in range(100_000):
        total += i * i
if how == "own":
    raise ValueError(f"the batch shapes do not match ({total % 7})")
print("Traceback (most recent call last):", file=sys.stderr)
print('  File "/work/train.py", line 40, in <module>', file=sys.stderr)
print(
    '  File "/venv/lib/python3.11/site-packages/torch/_inductor/codecache.py", line 2034, in load',
    file=sys.stderr,
)
print("torch._inductor.exc.CppCompileError: C++ compile error", file=sys.stderr, flush=True)
sys.exit(1)
