"""A python job for the warm standby (issue 51): says what it runs as, then steps.

``warm_job.py MODE [ARG...]``: it prints ``as argv=... name=... path0=... file=... torch=...``
(``torch``: whether torch was imported before its first line ran: a warm start), then steps.
Run 1 waits until the home's standby for run 2 is ready (its manifest), touches ``$TOUCH``
when set (a module the standby imported, changed), and exits 3 (with ``$HOLD`` set it steps on
until ended: the standby stays run 2's while a test reads it).  Run 2 does as MODE says:
``exit5`` (five steps, exit 5), ``wait`` (steps until ended), ``raise`` (a ValueError).
"""

import json
import os
import sys
import time

warm = "torch" in sys.modules
import helper_mod  # noqa: E402,F401  (a module outside the job's directory: the standby imports it)

run = int(os.environ.get("DFLASHD_RUN", "1"))
print(
    "as "
    + json.dumps(
        {
            "argv": sys.argv,
            "name": __name__,
            "path0": sys.path[0],
            "file": __file__,
            "torch": warm,
            "run": run,
        }
    ),
    flush=True,
)
mode = sys.argv[1]
if run == 1:
    manifest = os.path.join(os.environ["DFLASHD_HOME"], ".standby-run-2.json")
    least = int(os.environ.get("RUN1_STEPS", "20"))  # run 1's steps at least (run 2 redoes them)
    for step in range(1, 100000):
        print(f"step {step} loss {2.0 - step * 0.001:.4f}", flush=True)
        time.sleep(0.05)
        if os.path.exists(manifest) and step > least and not os.environ.get("HOLD"):
            break
    if os.environ.get("TOUCH"):
        with open(os.environ["TOUCH"], "a") as fh:
            fh.write("# changed\n")
    sys.exit(3)
for step in range(1, 100000):
    print(f"step {step} loss {1.5 - step * 0.001:.4f}", flush=True)
    time.sleep(0.05)
    if mode == "exit5" and step == 5:
        sys.exit(5)
    if mode == "raise" and step == 5:
        raise ValueError("boom at step 5")
