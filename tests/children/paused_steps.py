"""Steady steps (10 ms each) with a 1.5 s pause every 200 steps (a checkpoint's), and a loss
that wanders in its range: ``paused_steps.py N`` runs N steps and exits 0."""

import math
import sys
import time

for step in range(1, int(sys.argv[1]) + 1):
    time.sleep(0.01)
    if step % 200 == 0:
        time.sleep(1.5)  # a checkpoint: no step for a while
    loss = 2.0 + 0.3 * math.sin(step / 5.0)
    print(f"step {step} loss {loss:.4f}", flush=True)
