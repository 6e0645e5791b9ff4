"""A start-up stuck on a build lock a killed build left, as torch's JIT extension builds wait:
torch's own ``FileBaton`` polls the lock in a sleep loop until it is gone, then the job steps.

    build_lock_wait.py LOCK_PATH
"""

import sys
import time

from torch.utils.file_baton import FileBaton

baton = FileBaton(sys.argv[1])
print("building extension my_op", flush=True)
if baton.try_acquire():
    baton.release()
else:
    print(f"Waiting for lock on {sys.argv[1]}", flush=True)
    baton.wait()
for step in range(1, 4):
    print(f"step {step} loss {1.0 / step:.3f}", flush=True)
    time.sleep(0.2)
