"""Sends and prints numbers no counter can hold, then completes: the daemon must survive them.

notify STEP beyond 64 bits and STEP=1e30, step lines with 30 digits, a Lightning-like bar
whose count overflows, a loss of 1e999; then real steps 1..3 and exit 0.
"""

import sys

from _notify import notify

notify("READY=1")
notify("STEP=" + "9" * 30)
notify("STEP=1e30\nSTATUS=loss inf")
notify(f"STEP={2**64}\nEXTEND_TIMEOUT_USEC={10**40}")
print("step " + "9" * 30 + " loss 1e999", flush=True)
print(
    "Epoch " + "7" * 25 + ":  50%|#####     | " + "8" * 25 + "/" + "9" * 25 + " [00:01<00:01]",
    flush=True,
)
print("iteration " + "1" * 400 + "/ 100 | loss nan", flush=True)
for step in (1, 2, 3):
    notify(f"STEP={step}")
    print(f"step {step} loss 0.5", flush=True)
sys.exit(0)
