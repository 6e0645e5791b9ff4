"""Prints 'phase one', waits for a marker file, prints 'phase two' lines, exits 0."""

import os
import sys
import threading

marker = sys.argv[1]
print("phase one", flush=True)
while not os.path.exists(marker):
    threading.Event().wait(0.02)
for i in range(100):
    print(f"phase two {i}", flush=True)
