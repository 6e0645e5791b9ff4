"""Writes N numbered lines as fast as it can (big writes), then exits 0."""

import os
import sys

count = int(sys.argv[1])
batch = 5000
for start in range(0, count, batch):
    chunk = "".join(f"line {i:08d} {'x' * 60}\n" for i in range(start, min(count, start + batch)))
    data = chunk.encode()
    view = memoryview(data)
    while view:
        view = view[os.write(1, view) :]
sys.exit(0)
