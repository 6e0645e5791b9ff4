"""Steps every ``interval`` seconds (a line ``step N loss L``), then does as told at step ``at``:

argv: interval at what [seconds] [marker]
- ``lock``: the main thread blocks forever on a lock no one releases;
- ``socket``: it blocks forever reading a socket whose peer never writes;
- ``checkpoint``: it writes 200 MB to ``marker`` in 1 MB chunks spread over ``seconds``, then steps on;
- ``eval``: it computes in a Python loop for ``seconds`` with no output, then steps on;
- ``sleep``: it sleeps ``seconds`` without a word (a wait: a hang by the evidence);
- ``stream``: it reads ``marker`` (``host:port``) to its end, a server outside the run
  sending slowly;
- ``flock``: it takes an exclusive ``flock`` on ``marker``, which a sibling outside the run
  holds while it computes;
- ``fifo``: it reads the FIFO ``marker`` to its end, which a producer outside the run opened
  and fills late;
- ``dataprep``: data preparation: a pool of worker processes computes for ``seconds`` while
  the main thread waits on its results (``multiprocessing.Pool.map``);
- ``compile``: a first compile as inductor does it: compile workers started for the pause
  (a ``ProcessPoolExecutor``) compute for ``seconds`` while the main thread waits on futures;
- ``heartbeat``: the main loop freezes on a lock while a thread prints ``alive`` every 3 s;
- ``appender``: the main loop freezes on a lock while a thread appends a line to ``marker``
  every second.
After an ``eval``, ``checkpoint``, ``dataprep``, ``compile``, ``stream``, ``flock`` or ``fifo`` it steps 20 more times and
exits 0.  A relaunch (``DFLASHD_RUN`` > 1) runs 20 steps and exits 0.
"""

import os
import socket
import sys
import threading
import time


def busy(seconds: float) -> int:
    """Compute in a Python loop for ``seconds``."""
    end = time.monotonic() + seconds
    total = 0
    while time.monotonic() < end:
        for i in range(10_000):
            total += i * i
    return total


interval, at, what = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
seconds = float(sys.argv[4]) if len(sys.argv) > 4 else 150.0
marker = sys.argv[5] if len(sys.argv) > 5 else os.devnull


def steps(first: int, count: int) -> None:
    for step in range(first, first + count):
        print(f"step {step} loss {1.0 / step:.4f}", flush=True)
        time.sleep(interval)


if int(os.environ.get("DFLASHD_RUN", "1")) > 1:
    steps(1, 20)
    sys.exit(0)
steps(1, at)
if what == "lock":
    lock = threading.Lock()
    lock.acquire()
    lock.acquire()
elif what == "socket":
    mine, peer = socket.socketpair()
    mine.recv(1)
elif what == "sleep":
    time.sleep(seconds)
elif what == "checkpoint":
    chunk = os.urandom(1 << 20)
    with open(marker, "wb") as fh:
        for _ in range(200):
            fh.write(chunk)
            fh.flush()
            os.fsync(fh.fileno())
            time.sleep(seconds / 200)
    os.unlink(marker)
elif what == "stream":
    host, _, port = marker.rpartition(":")
    with socket.create_connection((host, int(port))) as conn:
        while conn.recv(65536):
            pass
elif what == "flock":
    import fcntl

    with open(marker, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
elif what == "fifo":
    with open(marker, "rb") as fh:
        while fh.read(65536):
            pass
elif what in ("heartbeat", "appender"):

    def side() -> None:
        while True:
            if what == "heartbeat":
                print("alive", flush=True)
                time.sleep(3)
            else:
                with open(marker, "a") as fh:
                    fh.write(f"{time.time():.3f} still here\n")
                time.sleep(1)

    threading.Thread(target=side, daemon=True).start()
    lock = threading.Lock()
    lock.acquire()
    lock.acquire()
elif what == "eval":
    busy(seconds)
elif what == "dataprep":
    import multiprocessing

    with multiprocessing.Pool(2) as pool:
        pool.map(busy, [seconds / 2] * 4, chunksize=1)  # two rounds of seconds / 2 each
elif what == "compile":
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(2) as pool:
        list(pool.map(busy, [seconds / 2] * 4))
steps(at + 1, 20)
sys.exit(0)
