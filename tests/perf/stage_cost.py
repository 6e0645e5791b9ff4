"""Where the log path's CPU goes, stage by stage (issue 26): the same block flood of step lines
through each stage alone, in this process, CPU seconds per GiB of the job's output.

    drain read   os.read of 64 KiB chunks from a pipe (the kernel's copy)
    framer       LineFramer.feed: chunks into whole lines
    tail         the drain's exit tail (PipeDrain's last lines)
    matcher      the built-in formats: the last step in each frame
    encode       encode_frame: the JSON-lines records
    write        the writer's append (write(2) of the encoded records)

    python tests/perf/stage_cost.py [--mib 256]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path

from _bench import daemon_argv  # noqa: F401  (sets up the import path)

from dflashd.logs.framer import LineFramer
from dflashd.logs.linecodec import CODEC
from dflashd.logs.records import encode_frame, utc_timestamp
from dflashd.logs.writer import RotatingLogWriter
from dflashd.supervisor.watch.linewatch import LineMatcher

PAD = b"x" * 64


def flood(mib: float) -> list[bytes]:
    template = b"step %09d loss %5.3f tok/s 51,200 lr 3e-4 " + PAD + b"\n"
    count = int(mib * 2**20) // len(template % (0, 0.0))
    data = b"".join(template % (i, i % 997 / 100) for i in range(count))
    return [data[i : i + 65536] for i in range(0, len(data), 65536)]


def cpu() -> float:
    return time.thread_time()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=float, default=256)
    args = parser.parse_args()
    chunks = flood(args.mib)
    gib = sum(map(len, chunks)) / 2**30
    costs: dict[str, float] = {}

    r, w = os.pipe()

    def feed_pipe() -> None:
        for chunk in chunks:
            view = memoryview(chunk)
            while view:
                view = view[os.write(w, view) :]
        os.close(w)

    writer_thread = threading.Thread(target=feed_pipe)
    writer_thread.start()
    started = cpu()
    while os.read(r, 65536):
        pass
    costs["drain read"] = cpu() - started
    writer_thread.join()
    os.close(r)

    framer = LineFramer()
    started = cpu()
    frames = [f for f in (framer.feed(c) for c in chunks) if f is not None]
    costs["framer"] = cpu() - started

    tail: deque[str] = deque(maxlen=50)
    started = cpu()
    for frame in frames:
        tail.extend(frame.last_lines(50))
    costs["tail"] = cpu() - started

    matcher = LineMatcher("", "", True)
    started = cpu()
    for frame in frames:
        matcher.match(frame)
    costs["matcher"] = cpu() - started

    ts = utc_timestamp(time.time())
    started = cpu()
    encoded = []
    seq = 1
    for frame in frames:
        encoded.append(encode_frame(1, "stdout", frame, ts, seq))
        seq += len(frame)
    costs["encode"] = cpu() - started

    with tempfile.TemporaryDirectory() as tmp:
        writer = RotatingLogWriter(Path(tmp), max_bytes=2**40, backups=1)
        started = cpu()
        now = time.time()
        for i in range(0, len(frames), 16):  # 1 MiB batches, as the sink coalesces them
            writer.write_frames([(1, "stdout", f, now) for f in frames[i : i + 16]])
        costs["writer (encode + write)"] = cpu() - started
        writer.close()

    total = sum(v for k, v in costs.items() if k != "writer (encode + write)")
    print(
        f"# stage_cost: {args.mib:g} MiB of step lines in 64 KiB chunks; CPU s per GiB;"
        f" inner loops: {CODEC.implementation}"
    )
    for name, value in costs.items():
        print(f"{name:24s} {value / gib:6.2f}")
    print(f"{'sum of stages':24s} {total / gib:6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
