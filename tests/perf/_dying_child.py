"""A child for death_latency.py: notes when it started and when it is about to die, then dies.

argv: MODE OUTDIR;  MODE in exit, segv, sigkill, partial_sigkill, grandchild.
"""

import time

started = time.time()  # the relaunched child's first statement
import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402

mode, outdir = sys.argv[1], sys.argv[2]
run = os.environ.get("DFLASHD_RUN", "0")
with open(os.path.join(outdir, f"start-{run}"), "w") as fh:
    fh.write(repr(started))
if mode == "grandchild":
    import subprocess

    subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(30)"]
    )  # holds stdout and stderr
if mode == "partial_sigkill":
    os.write(1, b"a partial line with no newline")
with open(os.path.join(outdir, f"death-{run}"), "w") as fh:
    fh.write(repr(time.time()))
if mode in ("exit", "grandchild"):
    os._exit(3)
if mode == "segv":
    import ctypes

    ctypes.string_at(0)
os.kill(os.getpid(), signal.SIGKILL)
