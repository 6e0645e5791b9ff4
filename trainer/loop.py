"""The training loop on one screen: :func:`train` and the few helpers its step calls."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dflashd.trainer.distributed import (
    Node,
    StopVotes,
    mean_over_nodes,
    stop_outcome,
)
from dflashd.trainer.model import ModelConfig, TargetModel
from dflashd.trainer.notify import Notifier
from dflashd.trainer.stopping import Stop
from dflashd.trainer.train import (
    EX_CONFIG,
    Injection,
    RecompileBlocked,
    TrainConfig,
    config_dict,
    get_lr,
    say,
)
from dflashd.trainer.workers import Worker


@dataclass
class Session:
    """Everything one training run holds: the models, the workers, the data, where to save."""

    cfg: TrainConfig
    mcfg: ModelConfig
    workers: list[Worker]
    target: TargetModel
    optimizer: torch.optim.Optimizer
    batch_for: Callable[[int, int], Any]  # (step, worker) -> that worker's batch of that step
    start_step: int
    ckpt_path: Path
    notifier: Notifier
    stop: Stop
    inject: Injection
    node: Node | None
    world_size: int = 1
    leader: bool = True

    @property
    def devices(self) -> list[torch.device]:
        """The workers' devices, in worker order."""
        return [w.device for w in self.workers]


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Atomic: write a temp file, then rename (a kill mid-save never tears the checkpoint)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def _grads(params: list[torch.nn.Parameter]) -> list[torch.Tensor]:
    return [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]


def average_gradients(replicas: list[list[torch.nn.Parameter]]) -> None:
    """Average every replica's gradients into replica 0: one flat buffer and one copy per replica."""
    if len(replicas) < 2:
        return
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

    with torch.no_grad():
        main = _grads(replicas[0])
        total = _flatten_dense_tensors(main)
        for other in replicas[1:]:
            total.add_(_flatten_dense_tensors(_grads(other)).to(total.device, non_blocking=True))
        total.div_(len(replicas))
        torch._foreach_copy_(main, list(_unflatten_dense_tensors(total, main)))


def broadcast_parameters(replicas: list[list[torch.nn.Parameter]]) -> None:
    """Copy replica 0's weights into the others, one flat transfer per replica."""
    if len(replicas) < 2:
        return
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

    with torch.no_grad():
        source = _flatten_dense_tensors([p.detach() for p in replicas[0]])
        for other in replicas[1:]:
            moved = source.to(other[0].device, non_blocking=True)
            targets = [p.detach() for p in other]
            torch._foreach_copy_(targets, list(_unflatten_dense_tensors(moved, targets)))


def train(s: Session) -> int:
    """The training loop: every worker thread computes its share of a step, the gradients
    are averaged (over threads, then nodes), one optimizer step, the weights go back out."""
    cfg, workers = s.cfg, s.workers
    step, started = s.start_step, time.monotonic()
    meter = _Meter(cfg.batch * cfg.blocks * cfg.block_size * cfg.workers * s.world_size)
    replicas = [list(w.drafter.parameters()) for w in workers]
    for w in workers:
        w.drafter.zero_grad(set_to_none=False)
    next_batches = [s.batch_for(step, w.index) for w in workers]
    votes, boundary = StopVotes(s.node), time.monotonic()
    while step < cfg.steps:
        lr = get_lr(step, cfg)
        for group in s.optimizer.param_groups:
            group["lr"] = lr
        for w, batch in zip(workers, next_batches, strict=True):
            w.submit_step(step, batch)
        next_batches = [s.batch_for(step + 1, w.index) for w in workers]  # built meanwhile
        results = _results(s, step)
        if results is None:
            return EX_CONFIG  # --require-flex, and a worker fell back to dense attention
        average_gradients(replicas)
        askers = votes.cast(replicas[0], s.stop.event.is_set())  # the same step on every node
        with torch.no_grad():
            torch.nn.utils.clip_grad_norm_(replicas[0], 1.0)
        s.optimizer.step()
        broadcast_parameters(replicas)
        for w in workers:
            w.drafter.zero_grad(set_to_none=False)
        step += 1
        loss = sum(r.loss for r in results) / len(results)
        acc = sum(r.acc for r in results) / len(results)
        nan_from = s.inject.crash_step if s.inject.kind == "nan_at_step" else None
        if nan_from is not None and step >= nan_from:
            loss = float("nan")  # --inject nan_at_step:N: the loss diverged
        if step == s.start_step + 1:
            s.notifier.send(f"READY=1\nSTEP={step}\nSTATUS=training")
            say(
                f"first_step step={step} secs_since_start={time.monotonic() - started:.2f} loss={loss:.3f}"
            )
        else:
            s.notifier.send(f"STEP={step}")
        meter.steps += 1
        if step % cfg.log_every == 0 or step == cfg.steps:
            loss = _log_step(s, step, loss, acc, lr, meter)
        stopping = bool(askers)
        if stopping:
            s.stop.at_boundary()  # the checkpoint below is local work: no deadline over it
        if (step % cfg.checkpoint_every == 0 or stopping or step == cfg.steps) and s.leader:
            _save(s, step, loss)
        if stopping:
            code, why = stop_outcome(askers, s.node, s.stop.event.is_set())
            say(f"stopped at step {step} (checkpoint {s.ckpt_path}){why}")
            return code
        boundary, last_boundary = time.monotonic(), boundary
        s.stop.step_took(boundary - last_boundary)
    return _completed(s, step)


@dataclass
class _Meter:
    """Tokens per second over the steps since the last log line."""

    tokens_per_step: int
    steps: int = 0
    since: float = 0.0

    def __post_init__(self) -> None:
        self.since = time.monotonic()

    def rate(self) -> float:
        elapsed = time.monotonic() - self.since
        tok_s = self.tokens_per_step * self.steps / elapsed if elapsed > 0 else 0.0
        self.steps, self.since = 0, time.monotonic()
        return tok_s


def _results(s: Session, step: int) -> list[Any] | None:
    """Every worker's result for ``step``; a blocked recompile or a silent fallback says so
    (None: a fallback under ``--require-flex``, training must stop)."""
    try:
        results = [w.result() for w in s.workers]
    except RuntimeError as exc:
        if "recompile" in str(exc).lower():
            raise RecompileBlocked(str(exc).splitlines()[0]) from exc
        raise
    expected_calls = s.mcfg.draft_layers if s.cfg.compile else 0
    bad = [i for i, r in enumerate(results) if r.compiled_calls < expected_calls]
    if s.cfg.compile and bad:
        say(f"dense_fallback: workers {bad} stopped calling the compiled attention at step {step}")
        s.notifier.send(f"STATUS=dense fallback in workers {bad}")
        if s.cfg.require_flex:
            return None
    return results


def _log_step(s: Session, step: int, loss: float, acc: float, lr: float, meter: _Meter) -> float:
    """The step line (nanoGPT-like, so any reader sees it) and the notify STATUS; the loss
    averaged over nodes."""
    loss, acc = mean_over_nodes([loss, acc], s.devices[0], s.node)
    mem = ""
    if s.cfg.device == "cuda":
        peak_mib = max(torch.cuda.max_memory_allocated(d) for d in set(s.devices)) / 2**20
        mem = f" mem {peak_mib:,.0f}MiB"
    say(
        f"step {step}/{s.cfg.steps} loss {loss:.3f} acc {acc:.3f} tok/s {meter.rate():,.0f} lr {lr:.1e}{mem}"
    )
    s.notifier.send(f"STATUS=step {step} loss {loss:.3f}")  # dflashd's status and report
    return loss


def _save(s: Session, step: int, loss: float) -> None:
    save_checkpoint(
        s.ckpt_path,
        {
            "step": step,
            "target": s.target.state_dict(),
            "drafter": s.workers[0].drafter.state_dict(),
            "optimizer": s.optimizer.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "config": config_dict(s.cfg),
            "loss": loss,
        },
    )


def _completed(s: Session, step: int) -> int:
    final = s.ckpt_path.with_name(f"completed-step{step}.pt")
    if not s.leader:
        rank = s.node.rank if s.node is not None else 0
        say(f"completed {step} steps (node rank {rank}; rank 0 keeps the checkpoint)")
        return 0
    if s.ckpt_path.exists():
        os.replace(s.ckpt_path, final)
    say(f"completed {step} steps; final checkpoint {final}")
    return 0
