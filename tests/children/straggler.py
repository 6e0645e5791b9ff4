"""Two ranks in a gloo group, each step a little work then an ``all_reduce``; from step
SLOW_FROM rank 1 works 0.5 s more in its own code (``straggle``), so every rank waits for it
in the collective: the job runs slow, and rank 1 is the straggler.  Rank 0 prints the steps.

    torchrun --nproc-per-node 2 straggler.py SLOW_FROM
"""

import datetime
import sys
import time

import torch
import torch.distributed as dist

SLOW_FROM = int(sys.argv[1])


def straggle() -> None:
    time.sleep(0.5)  # a starved rank: a slow disk, a busy CPU, a throttled GPU


def main() -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=900))
    rank = dist.get_rank()
    x = torch.ones(64)
    step = 0
    while True:
        step += 1
        time.sleep(0.03)
        if rank == 1 and step >= SLOW_FROM:
            straggle()
        x = x * 1.0001
        dist.all_reduce(x)
        if rank == 0:
            print(f"step {step} loss {2.0 + 0.01 * (step % 5):.4f}", flush=True)


if __name__ == "__main__":
    main()
