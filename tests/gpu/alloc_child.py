"""A GPU child: allocates argv[1] GiB with torch, says READY, then sleeps (or dies if argv[2] == 'die')."""

import os
import signal
import sys
import threading

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "children"))
from _notify import notify

gib = float(sys.argv[1])
block = torch.empty(int(gib * 2**30), dtype=torch.uint8, device="cuda")
block.fill_(1)
torch.cuda.synchronize()
print(f"holding {gib} GiB on cuda", flush=True)
if os.environ.get("NOTIFY_SOCKET"):
    notify("READY=1\nSTEP=1")
if len(sys.argv) > 2 and sys.argv[2] == "die":
    threading.Timer(3.0, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
threading.Event().wait()
