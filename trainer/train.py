"""The threaded DFlash drafter trainer's configuration and command line.

This module holds :class:`TrainConfig`, the CPU and GPU defaults, the learning-rate schedule
and the argument parser; the loop itself (one visible loop on the main thread, nanoGPT-style)
is :func:`dflashd.trainer.loop.train`, set up by :mod:`dflashd.trainer.session`.  The main
thread owns data, the optimizer step, logging and checkpoints; worker threads run
forward/backward on their shard (:mod:`dflashd.trainer.workers`).  Gradients are averaged on
the main thread into replica 0, which steps; the new weights are copied back to the others.

Exit codes: 0 completed or stopped (SIGTERM: finish the step, checkpoint, exit; 143 when the
step is stuck past --stop-grace-s, see stopping.py; 75 under torchrun when another node was
asked to stop, see distributed.StopVotes), 1 crashed,
78 (EX_CONFIG) for a configuration error that retrying cannot fix: a dense fallback under
--require-flex, or a blocked recompile.  dflashd never retries 78.
"""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Final

from dflashd.trainer.stopping import DEFAULT_GRACE_S

EX_CONFIG = 78


@dataclass(frozen=True)
class TrainConfig:
    """Everything a run needs; saved in every checkpoint."""

    steps: int = 300
    workers: int = 2
    batch: int = 8
    blocks: int = 8
    lr: float = 3e-3
    warmup_steps: int = 20
    seed: int = 1234
    log_every: int = 10
    checkpoint_every: int = 50
    attention: str = "dense"  # "flex" on GPU
    compile: bool = False  # on for GPU
    require_flex: bool = False
    device: str = "cpu"
    vocab: int = 64
    hidden: int = 64
    heads: int = 4
    ctx_len: int = 128
    block_size: int = 8
    draft_layers: int = 2
    target_layers: int = 2


def cpu_defaults() -> TrainConfig:
    """Sized to reach step 1 well within 30 s and learn visibly in a few minutes on 2 cores."""
    return TrainConfig()


def gpu_defaults(devices: int) -> TrainConfig:
    """Sized for one H200 per worker (a small real drafter; flex compiled on every thread)."""
    return TrainConfig(
        steps=2000,
        workers=max(1, devices),
        batch=8,
        blocks=64,
        lr=1e-3,
        warmup_steps=100,
        log_every=20,
        checkpoint_every=200,
        attention="flex",
        compile=True,
        require_flex=True,
        device="cuda",
        vocab=1024,
        hidden=512,
        heads=8,
        ctx_len=2048,
        block_size=16,
        draft_layers=2,
        target_layers=4,
    )


def get_lr(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up, then cosine decay to 10 %."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m dflashd.trainer",
        description="Train a small DFlash-style block drafter with one worker thread per device.",
    )
    parser.add_argument("--steps", type=int)
    parser.add_argument("--workers", type=int, help="worker threads (several may share one device)")
    parser.add_argument("--batch", type=int, help="sequences per worker per step")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument(
        "--attention", choices=["flex", "dense"], help="default: flex on GPU, dense on CPU"
    )
    parser.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="compile the attention on each worker thread (default: on for GPU; off for CPU, where a cold "
        "compile takes ~25 s on 2 cores)",
    )
    parser.add_argument(
        "--require-flex",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="exit 78 if any worker did not run the compiled kernel intended for it (default: on for GPU)",
    )
    parser.add_argument("--lr", type=float)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--log-every", type=int)
    parser.add_argument("--checkpoint-every", type=int)
    parser.add_argument(
        "--checkpoint-dir", type=Path, help="default: $DFLASHD_HOME/trainer, else ./dflashd-trainer"
    )
    parser.add_argument(
        "--dist-timeout-s",
        type=float,
        default=120.0,
        help="under torchrun: how long a collective (or the process group's setup) may wait for "
        "the other nodes before failing, so torchrun restarts the group",
    )
    parser.add_argument(
        "--stop-grace-s",
        type=float,
        default=DEFAULT_GRACE_S,
        help="after SIGTERM/SIGINT the step in flight finishes, then a checkpoint and exit 0; a "
        "step not done within 5x the slowest recent step (at least 2 s, at most this) is stuck, "
        "waiting for a dead peer say, and the trainer exits 128+signal at once instead",
    )
    parser.add_argument("--ctx-len", type=int)
    parser.add_argument("--hidden", type=int)
    parser.add_argument(
        "--inject",
        type=parse_injection,
        default=Injection(),
        help="fault for tests and demos: import_error | crash_before_first_step | hang_before_cuda | "
        "crash_at_step:N[:WORKER[:RANK]] | hang_at_step:N[:WORKER[:RANK]] (under dflashd: first run only; "
        "a hang on a GPU sits in the CUDA runtime) | dense_fallback | oom | nan_at_step:N "
        "(the loss is NaN from step N on, in every run: a divergence)",
    )
    return parser.parse_args(argv)


@dataclass(frozen=True, slots=True)
class Injection:
    """A fault for tests and demos (``--inject``), parsed once, on the command line."""

    kind: str = ""
    crash_step: int | None = None  # crash_at_step: the step, in this run (None: not this run)
    crash_worker: int = 0  # crash_at_step and hang_at_step: in this worker only


INJECTIONS: Final = frozenset(
    {"", "import_error", "crash_before_first_step", "hang_before_cuda", "dense_fallback", "oom"}
)


def parse_injection(text: str) -> Injection:
    """``--inject``'s value; an unknown fault is a usage error, never silently no fault.

    ``crash_at_step:N[:WORKER]`` fires in the first run under dflashd (and torchrun's first
    attempt) only, so the relaunch can resume past it.
    """
    kind, _, rest = text.partition(":")
    if kind == "nan_at_step" and rest.isdigit():
        return Injection(kind, int(rest))  # every run: a divergence resumed from comes back
    if kind in ("crash_at_step", "hang_at_step") and rest:
        parts = rest.split(":")
        if len(parts) not in (1, 2, 3) or not all(p.isdigit() for p in parts):
            raise argparse.ArgumentTypeError(f"{kind}:N[:WORKER[:RANK]] expected, not {text!r}")
        first_run = os.environ.get("DFLASHD_RUN", "1") == "1"
        first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
        # RANK: under torchrun, only that rank (the others see it as a frozen peer)
        this_rank = len(parts) < 3 or os.environ.get("RANK", "0") == parts[2]
        step = int(parts[0]) if first_run and first_attempt and this_rank else None
        return Injection(kind, step, int(parts[1]) if len(parts) > 1 else 0)
    if text not in INJECTIONS:
        known = " | ".join(sorted(k for k in INJECTIONS if k))
        raise argparse.ArgumentTypeError(
            f"unknown fault {text!r} ({known} | crash_at_step:N | hang_at_step:N | nan_at_step:N)"
        )
    return Injection(text)


def build_config(args: argparse.Namespace, cuda_devices: int) -> TrainConfig:
    on_gpu = args.device == "cuda" or (args.device == "auto" and cuda_devices > 0)
    cfg = gpu_defaults(cuda_devices) if on_gpu else cpu_defaults()
    overrides: dict[str, Any] = {}
    for name in (
        "steps",
        "workers",
        "batch",
        "lr",
        "seed",
        "log_every",
        "checkpoint_every",
        "ctx_len",
        "hidden",
    ):
        value = getattr(args, name)
        if value is not None:
            overrides[name] = value
    if args.attention:
        overrides["attention"] = args.attention
    if args.compile is not None:
        overrides["compile"] = args.compile
    if args.require_flex is not None:
        overrides["require_flex"] = args.require_flex
    return replace(cfg, **overrides)


def say(text: str) -> None:
    print(text, flush=True)


class RecompileBlocked(RuntimeError):
    """A compile after warm-up: steady state must never recompile."""


def checkpoint_dir(args: argparse.Namespace) -> Path:
    if args.checkpoint_dir is not None:
        return Path(args.checkpoint_dir)
    home = os.environ.get("DFLASHD_HOME")
    return Path(home) / "trainer" if home else Path("dflashd-trainer")


def config_dict(cfg: TrainConfig) -> dict[str, Any]:
    return asdict(cfg)
