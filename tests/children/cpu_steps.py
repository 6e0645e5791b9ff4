"""A job whose steps are CPU work on one CPU: ``cpu_steps.py CPU`` pins itself to CPU and
prints ``step N loss X`` after each step of about 8 ms of computing (calibrated at start),
for ever.  Another process on the same CPU makes each step wait for it."""

import os
import sys
import time

os.sched_setaffinity(0, {int(sys.argv[1])})


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
while True:
    work(n)
    step += 1
    print(f"step {step} loss {2.0 + (step % 7) * 0.01:.3f}", flush=True)
