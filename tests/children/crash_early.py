"""Dies before its first step with a traceback a retry might fix (a runtime error, not an import)."""

import sys

print("loading the dataset", flush=True)
print("Traceback (most recent call last):", file=sys.stderr)
print('  File "train.py", line 3, in <module>', file=sys.stderr)
print("RuntimeError: NCCL timeout while initialising", file=sys.stderr, flush=True)
sys.exit(1)
