"""A healthy job whose loss lines look odd (issue 50): fp16 loss-scaler skips (``loss nan``,
``grad_norm inf`` now and then, finite again next step), evaluation lines with their own step
and loss, Hugging Face evaluation bars (no description, their own total) and a spike that
recovers.  ``odd_losses.py contrastive|nll [nan_from]``: the loss positive (InfoNCE-like) or a
negative log-likelihood; with ``nan_from`` the loss turns NaN there and stays (a real
divergence), printed until the job is ended."""

import math
import random
import sys
import time

mode = sys.argv[1]
nan_from = int(sys.argv[2]) if len(sys.argv) > 2 else None
rng = random.Random(7)
steps = 400 if nan_from is None else 10**9
for step in range(1, steps + 1):
    time.sleep(0.01)
    if mode == "nll":
        loss = -1.0 - 2.0 * (1 - math.exp(-step / 150)) + rng.gauss(0, 0.03)
    else:
        loss = math.log(256) * math.exp(-step / 200) + 0.4 + rng.gauss(0, 0.05)
    if 200 <= step < 204:
        loss += 25.0  # a spike that recovers
    grad_norm = f"{1.0 + rng.random():.3f}"
    if step % 37 == 0:  # the loss scale was too high: the step is skipped, the scale halves
        loss, grad_norm = (math.nan, "inf") if step % 2 else (math.inf, "nan")
    if nan_from is not None and step >= nan_from:
        loss, grad_norm = math.nan, "nan"
    print(f"step {step} loss {loss:.4f} grad_norm {grad_norm}", flush=True)
    if step % 50 == 0:
        print(f"[eval] step {step // 50} loss {abs(loss) * 4 + 9:.4f}", flush=True)
        print(f"step {step} | eval_loss nan | val_loss {abs(loss) * 3 + 7:.3f}", flush=True)
        print(f"{{'eval_loss': {abs(loss) * 5 + 3:.4f}, 'eval_runtime': 0.3, 'epoch': 1.0}}")
        for batch in (10, 30, 50):
            bar = "█" * (batch // 5)
            sys.stderr.write(f"\r{batch * 2}%|{bar:<10}| {batch}/50 [00:00<00:01, 30.1it/s]")
            sys.stderr.flush()
        sys.stderr.write("\n")
