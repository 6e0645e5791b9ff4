"""The log path's C loops alone (issue 53): microseconds per call on one 240 KiB frame of
~110-byte step lines (what a block flood's drain reads at once), in this process.

    scan     CODEC.scan: the unsafe bytes and the newlines (the drain's read_lines runs it)
    encode   CODEC.encode: the frame's JSON-lines records
    prefix   CODEC.prefix: the echo's ``r1 out | `` lines
    copy     bytes(bytearray(frame)): one plain copy of the frame, for scale

    python tests/perf/codec_cost.py [--reps 2000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

from _bench import daemon_argv  # noqa: F401  (sets up the import path)

from dflashd.logs.heap import keep_freed_buffers
from dflashd.logs.linecodec import CODEC

HEAD = b'{"ts":"2026-12-05T10:00:00.123456Z","run":1,"src":"out","seq":'


def per_call_us(call: Callable[[], object], reps: int) -> float:
    """The median of five timings of ``reps`` calls, per call."""
    runs = []
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(reps):
            call()
        runs.append((time.perf_counter() - started) / reps * 1e6)
    return statistics.median(runs)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=2000)
    args = parser.parse_args()
    keep_freed_buffers()  # as the daemon does: a flood's buffers reused, not mapped afresh
    pad = b"x" * 64
    lines = [
        b"step %09d loss %5.3f tok/s 51,200 lr 3e-4 " % (i, i % 997 / 100) + pad
        for i in range(2200)
    ]
    frame, count = b"\n".join(lines), len(lines)
    simd = getattr(sys.modules.get("dflashd.logs._lines"), "simd", "none")
    print(
        f"# codec_cost: {len(frame)} bytes, {count} lines; inner loops: {CODEC.implementation}"
        f" (scan: {simd}; DFLASHD_SIMD=sse2 or avx2 holds it lower)"
    )
    calls: dict[str, Callable[[], object]] = {
        "scan": lambda: CODEC.scan(frame, 65536),
        "encode": lambda: CODEC.encode(frame, count, HEAD, 100, b',"line":"', b'"}\n'),
        "prefix": lambda: CODEC.prefix(frame, count, b"r1 out | "),
        "copy": lambda: bytes(bytearray(frame)),
    }
    for name, call in calls.items():
        print(f"{name:8s} {per_call_us(call, args.reps):8.1f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
