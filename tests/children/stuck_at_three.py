"""Every run prints steps 1-3, then waits forever without a word (a stuck job, issue 34)."""

import threading
import time

for step in range(1, 4):
    print(f"step {step} loss {1.0 / step:.3f}", flush=True)
    time.sleep(0.1)
threading.Event().wait()
