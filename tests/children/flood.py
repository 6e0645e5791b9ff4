"""Writes argv[1] numbered lines, every other one to stderr, then exits 0."""

import sys

count = int(sys.argv[1])
out, err = sys.stdout, sys.stderr
for i in range(count):
    (err if i % 2 else out).write(f"flood line {i:07d}\n")
sys.exit(0)
