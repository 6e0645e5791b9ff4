"""A trainer that leaves an inductor-like compile worker behind, then crashes after a step.

The worker is a script at <argv[1]>/torch/_inductor/compile_worker/__main__.py (where
inductor's lives in a real install) that ignores SIGTERM, as a slow one would, and sleeps.
argv[2]: a file prefix; the worker's pid goes to <argv[2]>.<run number>.
"""

import os
import subprocess
import sys
from pathlib import Path

folder = Path(sys.argv[1]) / "torch" / "_inductor" / "compile_worker"
folder.mkdir(parents=True, exist_ok=True)
entry = folder / "__main__.py"
entry.write_text(
    "import signal, threading\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('worker up', flush=True)\n"
    "threading.Event().wait()\n"
)
worker = subprocess.Popen([sys.executable, str(entry), "--workers=1"], stdout=subprocess.PIPE)
assert worker.stdout is not None
worker.stdout.readline()  # its SIGTERM disposition is in place
Path(f"{sys.argv[2]}.{os.environ['DFLASHD_RUN']}").write_text(str(worker.pid))
print("step 1 loss 2.0", flush=True)
sys.exit(1)
