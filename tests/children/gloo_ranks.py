"""Two (or more) ranks in one gloo group under torchrun; rank FROZEN_RANK freezes at step
FREEZE_AT (5 by default).

The other ranks then wait in all_reduce for it: the hang users meet, on CPU.
    torchrun --nproc-per-node=2 --standalone gloo_ranks.py [FROZEN_RANK [FREEZE_AT]]
"""

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

FROZEN_RANK = int(sys.argv[1]) if len(sys.argv) > 1 else 1
FREEZE_AT = int(sys.argv[2]) if len(sys.argv) > 2 else 5


def frozen_here() -> None:
    while True:  # a rank stuck in its own code (a dead data loader, a deadlock)
        time.sleep(0.2)


def main() -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    rank = dist.get_rank()
    x = torch.ones(64)
    for step in range(1, 10_000):
        if rank == FROZEN_RANK and step == FREEZE_AT:
            frozen_here()
        x = x * 1.0001
        dist.all_reduce(x)
        print(f"step {step} loss {1.0 / step:.4f} rank {rank} pid {os.getpid()}", flush=True)
        time.sleep(0.1)


if __name__ == "__main__":
    main()
