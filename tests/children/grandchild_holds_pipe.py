"""Starts a grandchild that inherits stdout and keeps writing, then exits 1 at once.

argv[1]: a file where the child writes its time.time() just before exiting.
"""

import subprocess
import sys
import time

grandchild = (
    "import time, sys\ntime.sleep(0.5)\nprint('grandchild late line', flush=True)\ntime.sleep(30)\n"
)
subprocess.Popen([sys.executable, "-c", grandchild])
print("child exiting now", flush=True)
with open(sys.argv[1], "w") as fh:
    fh.write(repr(time.time()))
sys.exit(1)
