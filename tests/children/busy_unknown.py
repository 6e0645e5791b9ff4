"""Works for a while printing lines no step format knows, then completes."""

import sys
import time

seconds = float(sys.argv[1])
deadline = time.monotonic() + seconds
n = 0
while time.monotonic() < deadline:
    n += 1
    print(f"shard {n} tokenized, queue depth 4", flush=True)
    time.sleep(0.1)
sys.exit(0)
