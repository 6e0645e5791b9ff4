"""Prints what a real framework prints (lines from their sources and issue threads), then ends.

    framework_lines.py lightning_tqdm | lightning_rich_silent SECONDS | mnist | ddp_tutorial |
                       hf_trainer | deepspeed_init_crash | rank_prefixed_crash | error_names_step

Bars redraw with ``\\r`` as tqdm does on a pipe; ``tqdm.write`` clears the bar first.
"""

import sys
import time

out = sys.stdout


def bar(desc: str, n: int, total: int, post: str = "") -> str:
    pct = int(100 * n / total)
    filled = "█" * (pct // 10)
    return f"\r{desc}{pct:3d}%|{filled:<10}| {n}/{total} [00:0{n % 10}<00:01,  4.47it/s{post}]"


def lightning_tqdm() -> None:
    # lightning.pytorch TQDMProgressBar: one main bar, reset each epoch, desc "Epoch N"
    for epoch in range(3):
        for n in range(7):
            out.write(bar(f"Epoch {epoch}: ", n, 6, ", v_num=0"))
            out.flush()
            time.sleep(0.01)
    out.write("\n`Trainer.fit` stopped: `max_epochs=3` reached.\n")


def lightning_rich_silent(seconds: float) -> None:
    # RichProgressBar on a pipe draws nothing while training: only Lightning's own lines
    print("GPU available: False, used: False")
    print("  | Name  | Type   | Params | Mode")
    print("0 | layer | Linear | 66     | train")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.1)
        sys.stderr.write("")  # computing, silently
    print("Traceback (most recent call last):", file=sys.stderr)
    print("RuntimeError: injected crash after step 30", file=sys.stderr)
    sys.exit(1)


def mnist() -> None:
    for epoch in (1, 2):
        for seen in range(0, 3200, 640):
            print(
                f"Train Epoch: {epoch} [{seen}/3200 ({100 * seen // 3200:.0f}%)]\tLoss: {2.3 / epoch - seen / 1e5:.6f}"
            )
            time.sleep(0.02)
        print(f"\nTest set: Average loss: 0.{epoch}000, Accuracy: 9{epoch}00/10000 (9{epoch}%)\n")


def ddp_tutorial() -> None:
    for epoch in range(4):
        print(f"[GPU0] Epoch {epoch} | Batchsize: 32 | Steps: 64")
        time.sleep(0.05)
        if epoch % 2 == 1:
            print(f"Epoch {epoch} | Training snapshot saved at snapshot.pt")


def hf_trainer() -> None:
    # transformers 5.x Trainer: a bar with no description; logs through tqdm.write (clears)
    for n in range(0, 21):
        out.write(bar("", n, 20))
        out.flush()
        if n and n % 5 == 0:
            out.write("\r" + " " * 60 + "\r")
            loss = 5.388 - n / 10
            out.write(
                f"{{'loss': '{loss:.3f}', 'grad_norm': '0.7782', 'learning_rate': '4.5e-05', 'epoch': '{n / 20:.2f}'}}\n"
            )
            out.write(bar("", n, 20))
            out.flush()
        time.sleep(0.01)
    out.write(
        "\n{'train_runtime': '1.2', 'train_samples_per_second': '66.1', 'train_loss': '4.9', 'epoch': '1'}\n"
    )
    print("Traceback (most recent call last):", file=sys.stderr)
    print("ValueError: crashed after the run", file=sys.stderr)
    sys.exit(1)


def deepspeed_init_crash() -> None:
    print(
        "[2025-03-11 02:06:58,985] [INFO] [logging.py:128:log_dist] [Rank 0] DeepSpeed info: version=0.19.8"
    )
    print(
        "[2025-03-11 02:06:59,001] [INFO] [logging.py:128:log_dist] [Rank 0] step=0, skipped=0, lr=[0.001], mom=[(0.9, 0.999)]"
    )
    print("Traceback (most recent call last):", file=sys.stderr)
    print("RuntimeError: CUDA driver initialisation failed", file=sys.stderr)
    sys.exit(1)


def rank_prefixed_crash() -> None:
    print("starting", flush=True)
    for line in (
        "[rank0]: Traceback (most recent call last):",
        '[rank0]:   File "train.py", line 12, in <module>',
        "[rank0]: RuntimeError: Expected all tensors to be on the same device",
    ):
        print(line, file=sys.stderr)
    sys.exit(1)


def error_names_step() -> None:
    print("loading", flush=True)
    print("RuntimeError: injected crash after step 30", file=sys.stderr)
    print("ValueError: bad value at step 31", file=sys.stderr)
    sys.exit(1)


def rich_bar_crash() -> None:
    # Lightning's RichProgressBar draws with rich.progress: "Epoch 0/-2 ━━━━ 3/8 …"
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    with Progress(TextColumn("Epoch 0/-2"), BarColumn(), MofNCompleteColumn()) as bar:
        task = bar.add_task("train", total=8)
        for _ in range(5):
            time.sleep(0.15)
            bar.advance(task)
            bar.refresh()
        raise RuntimeError("injected crash after step 5")


name = sys.argv[1]
if name == "lightning_rich_silent":
    lightning_rich_silent(float(sys.argv[2]))
else:
    globals()[name]()
