"""The benchmark's child: writes N MiB of ~120-byte numbered step lines, 1 in 16 to stderr.

argv: MODE(block|line|slow) MIB REPORT_FILE
block: ~64 KiB per write(2) per stream (a C program, a buffered stream);
line:  one write(2) per line (print() under PYTHONUNBUFFERED=1);
slow:  one line every 10 ms carrying its send time (for the lag at low rates).
The child times itself and writes {"mib_s":…, "last_write":…} to REPORT_FILE, with the
SHA-256 of what it writes to each stream (taken before the clock starts), so a launcher's
copy of the bytes can be checked.
"""

import hashlib
import json
import os
import sys
import time

mode, mib, report = sys.argv[1], float(sys.argv[2]), sys.argv[3]
pad = "x" * 64


def line(i: int) -> bytes:
    return f"step {i:09d} loss {i % 997 / 100:.3f} tok/s 51,200 lr 3e-4 {pad}\n".encode()


total = int(mib * 1024 * 1024)
# Generate everything before the clock starts: the benchmark measures writing, not formatting.
count = total // len(line(0)) if mode != "slow" else int(mib)
template = b"step %09d loss %5.3f tok/s 51,200 lr 3e-4 " + pad.encode() + b"\n"
lines = [template % (i, i % 997 / 100) for i in range(count)] if mode != "slow" else []
written = 0
# Each stream's bytes, as its reader must find them (block and line modes write the same)
out = b"".join(lines[i] for i in range(len(lines)) if i % 16 != 15)
err = b"".join(lines[15::16])
digests = {"stdout_sha256": hashlib.sha256(out), "stderr_sha256": hashlib.sha256(err)}
if mode != "block":
    del out, err
start = time.perf_counter()
if mode == "block":
    o = e = 0
    block = 65536
    # Interleave the two streams as a program writing both would.
    while o < len(out) or e < len(err):
        if o < len(out):
            o += os.write(1, out[o : o + block])
        if e < len(err) and (e * 15 <= o or o >= len(out)):
            e += os.write(2, err[e : e + block])
    written = len(out) + len(err)
elif mode == "line":
    write = os.write
    for i, data in enumerate(lines):
        write(2 if i % 16 == 15 else 1, data)
    written = sum(map(len, lines))
else:
    for i in range(count):
        os.write(1, f"sent {time.time():.6f} {i}\n".encode())
        time.sleep(0.01)
elapsed = time.perf_counter() - start
with open(report, "w") as fh:
    json.dump(
        {
            "mib_s": written / elapsed / 2**20,
            "lines": count,
            "last_write": time.time(),
            "elapsed_s": elapsed,
            "cpu_s": time.process_time(),  # the child's own CPU, all of it
            "bytes": written,
            "stderr_lines": len(lines[15::16]),
            **{name: digest.hexdigest() for name, digest in digests.items()},
        },
        fh,
    )
