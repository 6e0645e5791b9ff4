"""Prints, then waits until the file named by argv[1] exists, then exits with argv[2] (default 1)."""

import os
import sys
import threading

print("working", flush=True)
while not os.path.exists(sys.argv[1]):
    threading.Event().wait(0.05)
sys.exit(int(sys.argv[2]) if len(sys.argv) > 2 else 1)
