"""Reports READY, starts a grandchild in its own process group... no: in the same group; then sleeps.

Used for: SIGKILL of the daemon must leave nothing behind. argv[1]: file to write the two pids to.
"""

import subprocess
import sys
import threading

from _notify import notify

grandchild = subprocess.Popen([sys.executable, "-c", "import threading; threading.Event().wait()"])
with open(sys.argv[1], "w") as fh:
    fh.write(f"{grandchild.pid}\n")
notify("READY=1\nSTEP=1")
print("running", flush=True)
threading.Event().wait()
