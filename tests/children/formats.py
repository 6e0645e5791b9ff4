"""Prints training progress the way a real trainer does, then ends as told.

argv: FORMAT STEPS crash|exit0|hang
The lines follow each trainer's real output (see dflashd.supervisor.model.formats for sources);
progress bars redraw with \\r as tqdm does.
"""

import sys
import threading
import time

fmt, steps, end = sys.argv[1], int(sys.argv[2]), sys.argv[3]
out = sys.stdout


def bar(n: int, total: int, prefix: str = "", postfix: str = "") -> str:
    filled = int(10 * n / total)
    pct = int(100 * n / total)
    return (
        f"{prefix}{pct:3d}%|{'█' * filled}{' ' * (10 - filled)}| {n}/{total} "
        f"[00:{n:02d}<00:{total - n:02d},  4.47it/s{postfix}]"
    )


print("loading the model and the data", flush=True)
if fmt in ("tqdm", "lightning"):
    prefix = "Epoch 0: " if fmt == "lightning" else ""
    out.write("\r" + bar(0, steps, prefix))  # tqdm draws the empty bar first: not a step
for step in range(1, steps + 1):
    time.sleep(0.02)
    if fmt == "nanogpt":
        out.write(f"iter {step}: loss {4.2 - step * 0.1:.4f}, time 561.94ms, mfu 16.68%\n")
    elif fmt == "megatron":
        out.write(
            f" iteration {step:8d}/{steps:8d} | consumed samples:         {step * 512} | "
            "elapsed time per iteration (ms): 1391.4 | learning rate: 1.507E-05 | "
            f"global batch size:  1024 | lm loss: {2.3 - step * 0.01:.6E} | loss scale: 1.0 |\n"
        )
    elif fmt == "torchtitan":
        out.write(
            f"[rank0]:[titan] 2025-03-12 11:10:21,511 - root - INFO - \x1b[31mstep: {step:2}  "
            f"\x1b[32mloss: {6.2 - step * 0.01:7.4f}  \x1b[33mmemory:  1.41GiB(1.79%)  "
            "\x1b[34mtps: 193,831  \x1b[36mtflops: 18.36  \x1b[35mmfu: 1.86%\x1b[39m\n"
        )
    elif fmt == "deepspeed":
        out.write(
            "[2022-03-11 02:06:58,985] [INFO] [logging.py:69:log_dist] [Rank 0] "
            f"step={step}, skipped=0, lr=[5e-05], mom=[[0.9, 0.999]]\n"
        )
    elif fmt == "lightning":
        out.write("\r" + bar(step, steps, "Epoch 0: ", f", loss={10.0 - step:.3f}, v_num=0"))
    elif fmt == "tqdm":
        out.write("\r" + bar(step, steps))
    elif fmt == "pytorch_examples":
        out.write(f"[GPU0] Epoch {step - 1} | Batchsize: 32 | Steps: 64\n")
    elif fmt == "plain":
        out.write(f"Step {step}/{steps} loss {2.0 - step * 0.1:.3f}\n")
    out.flush()
if fmt in ("tqdm", "lightning"):
    out.write("\n")
    out.flush()
if end == "crash":
    print("RuntimeError: CUDA error: an illegal memory access was encountered", file=sys.stderr)
    sys.exit(1)
if end == "hang":
    threading.Event().wait()
sys.exit(0)
