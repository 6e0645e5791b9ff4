"""Reports steps (by notify or by printed lines), then ends as told.

argv: notify|pattern  crash|exit0|hang  [steps]
"""

import sys
import threading

from _notify import notify

how, end = sys.argv[1], sys.argv[2]
steps = int(sys.argv[3]) if len(sys.argv) > 3 else 3
for step in range(1, steps + 1):
    if how == "notify":
        notify(f"STEP={step}" + ("\nREADY=1" if step == 1 else ""))
        # nothing a built-in format reads as a step: the line must not race the datagram
        print("notified the supervisor", flush=True)
    else:
        print(f"step {step}/{steps} loss 1.0", flush=True)
if end == "crash":
    print("RuntimeError: boom", file=sys.stderr, flush=True)
    sys.exit(5)
if end == "hang":
    threading.Event().wait()
sys.exit(0)
