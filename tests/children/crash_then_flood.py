"""Run 1 dies at once (an alert fires); run 2 floods argv[1] lines and reports its own rate in argv[2]."""

import os
import sys
import time

if os.environ.get("DFLASHD_RUN") == "1":
    print("dying so that an alert fires", file=sys.stderr, flush=True)
    sys.exit(1)
count = int(sys.argv[1])
started = time.perf_counter()
for i in range(count):
    print(f"flood line {i:07d} " + "x" * 80)
sys.stdout.flush()
with open(sys.argv[2], "w") as fh:
    fh.write(f"{count / (time.perf_counter() - started):.0f}")
