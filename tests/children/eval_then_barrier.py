"""Every rank steps in a gloo group; at step EVAL_AT rank 0 evaluates (a Python loop, no
output) or saves a checkpoint (SAVE_MB in 1 MB chunks) for SECONDS while every other rank
waits in ``dist.barrier()`` (``deadlock``: every rank instead waits in ``dist.recv`` from the
next one, for ever: the whole world is stuck; ``freeze``: rank 1 blocks for ever on a lock of
its own at EVAL_AT in the first run, ``DFLASHD_RUN`` 1, while its peers wait in ``all_reduce``;
``eval_then_freeze``: ``eval`` in torchrun's first round, ``freeze`` in its next ones; with
PATH, ``eval`` also lasts until PATH.go exists) — the ``if rank == 0: evaluate(); dist.barrier()`` of nearly
every multi-node trainer — then all step on to STEPS and exit 0.

    torchrun ... eval_then_barrier.py EVAL_AT SECONDS STEPS eval|checkpoint|deadlock|freeze|eval_then_freeze [PATH]
"""

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

EVAL_AT, SECONDS, STEPS = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
MODE = sys.argv[4] if len(sys.argv) > 4 else "eval"
PATH = sys.argv[5] if len(sys.argv) > 5 else ""
SAVE_MB = 500


def evaluate() -> None:
    """SECONDS of a Python loop; with PATH, also until PATH + ".go" exists (the test's word
    that the other node has judged the wait: on a loaded box that may take longer than
    SECONDS), looked for twice a second, for at most SECONDS + 300."""
    began = time.monotonic()
    release = PATH + ".go" if PATH else ""
    looked = began
    total = 0
    while (spent := time.monotonic() - began) < SECONDS or (release and spent < SECONDS + 300):
        total += sum(i * i for i in range(2000))
        if release and spent >= SECONDS and time.monotonic() - looked >= 0.5:
            looked = time.monotonic()
            if os.path.exists(release):
                break


def save() -> None:
    chunk = os.urandom(1 << 20)
    pause = SECONDS / SAVE_MB
    with open(PATH, "wb") as fh:
        for _ in range(SAVE_MB):
            fh.write(chunk)
            fh.flush()
            time.sleep(pause)
    os.unlink(PATH)


def main() -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=900))
    rank = dist.get_rank()
    x = torch.ones(64)
    for step in range(1, STEPS + 1):
        first_run = os.environ.get("DFLASHD_RUN", "1") == "1"
        if step == EVAL_AT and MODE == "freeze" and rank == 1 and first_run:
            import threading

            lock = threading.Lock()
            lock.acquire()
            lock.acquire()  # its own code, waiting for ever: the culprit
        if step == EVAL_AT and MODE == "deadlock":
            dist.recv(torch.zeros(1), src=(rank + 1) % dist.get_world_size())
        restarted = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0"
        if step == EVAL_AT and MODE == "eval_then_freeze" and restarted and first_run:
            if rank == 1:  # torchrun's next round: the culprit, frozen in its own code
                import threading

                lock = threading.Lock()
                lock.acquire()
                lock.acquire()
        elif step == EVAL_AT and (
            MODE in ("eval", "checkpoint")
            or (MODE == "eval_then_freeze" and not restarted and first_run)
        ):
            if rank == 0:
                evaluate() if MODE != "checkpoint" else save()
            dist.barrier()
        x = x * 1.0001
        dist.all_reduce(x)
        print(f"step {step} loss {1.0 / step:.4f} rank {rank}", flush=True)
        time.sleep(0.1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
