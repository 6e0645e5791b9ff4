"""A job whose loss goes NaN at step 30 of every run.  ``diverges_then_crashes.py``: the
first run crashes at step 35 (after its divergence), the relaunch diverges at step 30 again;
``... stay``: it prints NaN for ever (a run dflashd must end)."""

import os
import sys
import time

stay = len(sys.argv) > 1 and sys.argv[1] == "stay"
first_run = os.environ.get("DFLASHD_RUN", "1") == "1"
step = 0
while True:
    step += 1
    time.sleep(0.02)
    loss = float("nan") if step >= 30 else 3.0 - step * 0.01
    print(f"step {step} loss {loss:.4f}", flush=True)
    if first_run and not stay and step == 35:
        raise SystemExit(1)
