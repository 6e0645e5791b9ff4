"""Starts a grandchild with an empty environment (no dflashd mark), in its own session; waits.

argv[1]: a file the grandchild's pid is written to once it runs.
"""

import subprocess
import sys
import threading

from _notify import notify

grandchild = subprocess.Popen(
    [sys.executable, "-c", "import threading; threading.Event().wait()"],
    env={},
    start_new_session=True,
)
with open(sys.argv[1], "w") as fh:
    fh.write(f"{grandchild.pid}\n")
notify("READY=1\nSTEP=1")
print("running", flush=True)
threading.Event().wait()
