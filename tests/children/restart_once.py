"""A torchrun worker that steps, saves its step every SAVE_EVERY steps, and on torchrun's first
attempt kills itself with SIGKILL at step DIE_AT; torchrun (``--max-restarts 1``) starts it
again, it resumes from the saved step and runs to STEPS.  Steps DIE_AT - (DIE_AT % SAVE_EVERY)
.. DIE_AT are done twice.  No torch needed: torchrun only launches it.

    torchrun --max-restarts 1 ... restart_once.py STATE_FILE DIE_AT STEPS [SAVE_EVERY]
"""

import os
import signal
import sys
import time
from pathlib import Path

STATE = Path(sys.argv[1])
DIE_AT, STEPS = int(sys.argv[2]), int(sys.argv[3])
SAVE_EVERY = int(sys.argv[4]) if len(sys.argv) > 4 else 10


def main() -> None:
    start = int(STATE.read_text()) if STATE.exists() else 0
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if start:
        print(f"resumed from step {start}", flush=True)
    for step in range(start + 1, STEPS + 1):
        time.sleep(0.1)
        print(f"step {step} loss {1.0 / step:.4f}", flush=True)
        if step % SAVE_EVERY == 0:
            STATE.write_text(str(step))
        if step == DIE_AT and attempt == 0:
            os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main()
