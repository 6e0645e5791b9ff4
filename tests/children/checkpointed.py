"""A job that checkpoints and resumes, as a real trainer does (goodput tests).

argv: checkpoint step_s every die_at until [then]
Steps every ``step_s`` seconds (``step N loss L``) from the step saved in ``checkpoint``
(``none``: no checkpoint, every run starts at step 1), saving it every ``every`` steps.
The first run to reach ``die_at`` SIGKILLs itself (a file ``checkpoint.died`` remembers it
was done).  At ``until`` it exits 0, or with ``then`` = ``hang`` sleeps forever without a word.
"""

import os
import signal
import sys
import time

checkpoint, step_s, every = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
die_at, until = int(sys.argv[4]), int(sys.argv[5])
then = sys.argv[6] if len(sys.argv) > 6 else "exit"
saving = checkpoint != "none"
died_marker = (checkpoint if saving else os.environ["DFLASHD_HOME"] + "/ckpt") + ".died"

start = 0
if saving and os.path.exists(checkpoint):
    with open(checkpoint) as fh:
        start = int(fh.read())
step = start
while step < until:
    time.sleep(step_s)
    step += 1
    print(f"step {step} loss {1.0 / step:.4f}", flush=True)
    if saving and step % every == 0:
        with open(checkpoint + ".tmp", "w") as fh:
            fh.write(str(step))
        os.replace(checkpoint + ".tmp", checkpoint)
    if step == die_at and not os.path.exists(died_marker):
        open(died_marker, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
if then == "hang":
    while True:
        time.sleep(3600)
sys.exit(0)
