"""The training loop proper (imported after argument parsing, so `--help` and injected import errors are fast)."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

import torch

from dflashd.trainer.data import MarkovChain, SequencePool, make_batch
from dflashd.trainer.distributed import (
    Node,
    StopVotes,
    join,
    leave,
    local_device_slots,
    mean_over_nodes,
    share_resume,
    stop_outcome,
)
from dflashd.trainer.model import Drafter, ModelConfig, TargetModel
from dflashd.trainer.notify import Notifier
from dflashd.trainer.stopping import Stop
from dflashd.trainer.train import (
    EX_CONFIG,
    RecompileBlocked,
    TrainConfig,
    build_config,
    checkpoint_dir,
    config_dict,
    get_lr,
    say,
)
from dflashd.trainer.workers import WarmupReport, Worker


def model_config(cfg: TrainConfig) -> ModelConfig:
    ids = tuple(sorted({0, cfg.target_layers // 2, cfg.target_layers - 1}))
    return ModelConfig(
        vocab=cfg.vocab,
        hidden=cfg.hidden,
        heads=cfg.heads,
        target_layers=cfg.target_layers,
        draft_layers=cfg.draft_layers,
        ctx_len=cfg.ctx_len,
        block_size=cfg.block_size,
        target_layer_ids=ids,
    )


def worker_devices(cfg: TrainConfig) -> list[torch.device]:
    """One worker per device slot; more workers than GPUs share them round-robin.

    Under torchrun with several processes per node, each takes its share of the node's GPUs.
    """
    if cfg.device == "cuda":
        slots = local_device_slots(torch.cuda.device_count())
        return [torch.device("cuda", slots[i % len(slots)]) for i in range(cfg.workers)]
    return [torch.device("cpu")] * cfg.workers


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


def parse_crash_at(inject: str) -> tuple[int | None, int]:
    """``crash_at_step:N[:WORKER]``; under dflashd it fires in the first run only, so the relaunch can resume."""
    first_run = os.environ.get("DFLASHD_RUN", "1") == "1"
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"  # torchrun's restarts
    if not inject.startswith("crash_at_step:") or not first_run or not first_attempt:
        return None, 0
    parts = inject.split(":")
    return int(parts[1]), int(parts[2]) if len(parts) > 2 else 0


def run(args: argparse.Namespace, stop: Stop, inject: str) -> int:
    notifier = Notifier()
    cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
    cfg = build_config(args, cuda)
    if cfg.device == "cpu" and cfg.attention == "flex":
        say(
            "config error: flex_attention has no backward on CPU in this torch; use --attention dense"
        )
        return EX_CONFIG
    if cfg.device == "cpu":
        say(
            "attention: dense path on CPU on purpose (FlexAttention has no backward on CPU); "
            "the mask comes from the same mask_mod as the GPU's flex path"
        )
    devices = worker_devices(cfg)
    if cfg.device == "cuda":
        torch.cuda.set_device(devices[0])  # NCCL binds to the main thread's current device
    node = join(cfg.device, args.dist_timeout_s)
    code, error = 1, None
    try:
        code = _run_joined(args, stop, inject, cfg, node, devices, notifier)
        return code
    except BaseException as exc:
        code, error = (EX_CONFIG if isinstance(exc, RecompileBlocked) else 1), exc
        raise
    finally:
        if node is not None:
            stop.bound_exit(code, error, "leaving the process group and exiting")
        leave(node)


def _run_joined(
    args: argparse.Namespace,
    stop: Stop,
    inject: str,
    cfg: TrainConfig,
    node: Node | None,
    devices: list[torch.device],
    notifier: Notifier,
) -> int:
    mcfg = model_config(cfg)
    torch.manual_seed(cfg.seed)
    target = TargetModel(mcfg)
    drafter = Drafter(mcfg)
    ckpt_path = checkpoint_dir(args) / "latest.pt"
    start_step = 0
    resume: dict[str, Any] | None = None
    if (node is None or node.leader) and ckpt_path.exists():
        resume = torch.load(ckpt_path, map_location="cpu", weights_only=False)
    resume = share_resume(resume, node)  # rank 0's checkpoint for every node
    if resume is not None:
        if resume["config"] != config_dict(cfg):
            say(f"checkpoint {ckpt_path} was written with another config; refusing to mix them")
            return EX_CONFIG
        target.load_state_dict(resume["target"])
        drafter.load_state_dict(resume["drafter"])
        start_step = int(resume["step"])
        torch.set_rng_state(resume["torch_rng"])
        say(f"resumed from {ckpt_path} at step {start_step}")
    crash_step, crash_worker = parse_crash_at(inject)
    where = (
        f", node rank {node.rank} of {node.world_size} ({node.backend})" if node is not None else ""
    )
    say(
        f"dflashd trainer: torch {torch.__version__}, {cfg.workers} worker thread(s) on "
        f"{', '.join(sorted({str(d) for d in devices}))}, attention {cfg.attention}"
        f"{' compiled' if cfg.compile else ' eager'}, steps {cfg.steps}, run {os.environ.get('DFLASHD_RUN', '-')}"
        f"{where}"
    )
    target_state, drafter_state = target.state_dict(), drafter.state_dict()
    workers = [
        Worker(
            i,
            dev,
            mcfg,
            cfg.batch,
            cfg.blocks,
            attention=cfg.attention,
            compile_attention=cfg.compile,
            target_state=target_state,
            drafter_state=drafter_state,
            inject_dense=inject == "dense_fallback" and i == 0,
            crash_at_step=crash_step if i == crash_worker else None,
        )
        for i, dev in enumerate(devices)
    ]
    for w in workers:
        w.start()
    try:
        return _train(
            cfg, mcfg, workers, target, resume, start_step, ckpt_path, notifier, stop, inject, node
        )
    finally:
        # Worker threads must be gone before the interpreter exits, or torch aborts the process.
        for w in workers:
            w.stop()
        for w in workers:
            w.thread.join(timeout=30)


def _train(
    cfg: TrainConfig,
    mcfg: ModelConfig,
    workers: list[Worker],
    target: TargetModel,
    resume: dict[str, Any] | None,
    start_step: int,
    ckpt_path: Path,
    notifier: Notifier,
    stop: Stop,
    inject: str,
    node: Node | None,
) -> int:
    devices = [w.device for w in workers]
    # Across nodes every worker thread has its own data: global index = rank * workers + local.
    first_worker = node.rank * cfg.workers if node is not None else 0
    world_size = node.world_size if node is not None else 1
    leader = node is None or node.leader
    chain = MarkovChain.build(cfg.vocab, cfg.seed)
    length = cfg.ctx_len + cfg.block_size
    pools = [
        SequencePool.build(
            chain, seed=cfg.seed, worker=first_worker + w.index, size=256, length=length
        )
        for w in workers
    ]
    optimizer = torch.optim.AdamW(workers[0].drafter.parameters(), lr=cfg.lr, weight_decay=0.0)
    if resume is not None:
        optimizer.load_state_dict(resume["optimizer"])

    def batch_for(step: int, worker: int) -> Any:
        return make_batch(
            pools[worker],
            seed=cfg.seed,
            step=step,
            worker=first_worker + worker,
            batch=cfg.batch,
            ctx_len=cfg.ctx_len,
            blocks=cfg.blocks,
            block_size=cfg.block_size,
            mask_token=mcfg.mask_token,
        )

    # Warm-up: every worker compiles its own first step (forward and backward), one at a time.
    started = time.monotonic()
    reports: list[WarmupReport] = []
    for w in workers:
        notifier.send(f"EXTEND_TIMEOUT_USEC={600 * 1_000_000}\nSTATUS=compiling worker {w.index}")
        say(f"compile_start worker={w.index} device={w.device}")
        w.submit_warmup(batch_for(start_step, w.index))
        report = w.result()
        reports.append(report)
        peak = f" peak_mem_mib={report.peak_mem_mib:.0f}" if report.peak_mem_mib is not None else ""
        say(
            f"compile_done worker={w.index} attention_backend={report.backend} expected={report.expected} "
            f"secs={report.compile_s:.2f} graphs={report.graphs} compiled_calls={report.compiled_calls}{peak} "
            f"recompile_limit={report.config.get('recompile_limit')}"
        )
    fallbacks = [r for r in reports if not r.as_expected]
    if fallbacks:
        detail = ", ".join(
            f"worker {r.worker}: {r.backend} (expected {r.expected})" for r in fallbacks
        )
        say(f"dense_fallback: {detail}")
        notifier.send(f"STATUS=dense fallback: {detail}")
        if cfg.require_flex:
            say("--require-flex: refusing to train on an unintended attention path (exit 78)")
            return EX_CONFIG
    if cfg.compile:
        torch.compiler.set_stance("fail_on_recompile")
    say(
        f"warmup_all_done secs={time.monotonic() - started:.2f} stance={'fail_on_recompile' if cfg.compile else 'eager'}"
    )
    if inject == "crash_before_first_step":
        raise RuntimeError("injected crash before the first step")
    if inject == "oom":
        if cfg.device == "cuda":
            torch.empty(1 << 50, dtype=torch.uint8, device=devices[0])
        raise torch.OutOfMemoryError("injected: CUDA out of memory (simulated on CPU)")

    tokens_per_step = cfg.batch * cfg.blocks * cfg.block_size * cfg.workers * world_size
    step = start_step
    first_done = False
    window_start, window_steps = time.monotonic(), 0
    replica_params = [list(w.drafter.parameters()) for w in workers]
    for w in workers:
        w.drafter.zero_grad(set_to_none=False)
    next_batches = [batch_for(step, w.index) for w in workers]
    votes, boundary = StopVotes(node), time.monotonic()
    while step < cfg.steps:
        lr = get_lr(step, cfg)
        for group in optimizer.param_groups:
            group["lr"] = lr
        for w, batch in zip(workers, next_batches, strict=True):
            w.submit_step(step, batch)
        # The next step's batches are built while the workers compute this one.
        next_batches = [batch_for(step + 1, w.index) for w in workers]
        try:
            results = [w.result() for w in workers]
        except RuntimeError as exc:
            if "recompile" in str(exc).lower():
                raise RecompileBlocked(str(exc).splitlines()[0]) from exc
            raise
        expected_calls = mcfg.draft_layers if cfg.compile else 0
        if cfg.compile and any(r.compiled_calls < expected_calls for r in results):
            bad = [i for i, r in enumerate(results) if r.compiled_calls < expected_calls]
            say(
                f"dense_fallback: workers {bad} stopped calling the compiled attention at step {step}"
            )
            notifier.send(f"STATUS=dense fallback in workers {bad}")
            if cfg.require_flex:
                return EX_CONFIG
        main_params = replica_params[0]
        average_gradients(replica_params)
        askers = votes.cast(main_params, stop.event.is_set())  # the same step on every node
        with torch.no_grad():
            torch.nn.utils.clip_grad_norm_(main_params, 1.0)
        optimizer.step()
        broadcast_parameters(replica_params)
        for w in workers:
            w.drafter.zero_grad(set_to_none=False)
        step += 1
        window_steps += 1
        loss = sum(r.loss for r in results) / len(results)
        acc = sum(r.acc for r in results) / len(results)
        if not first_done:
            first_done = True
            notifier.send(f"READY=1\nSTEP={step}\nSTATUS=training")
            say(
                f"first_step step={step} secs_since_start={time.monotonic() - started:.2f} loss={loss:.3f}"
            )
        else:
            notifier.send(f"STEP={step}")
        if step % cfg.log_every == 0 or step == cfg.steps:
            loss, acc = mean_over_nodes([loss, acc], devices[0], node)
            elapsed = time.monotonic() - window_start
            tok_s = tokens_per_step * window_steps / elapsed if elapsed > 0 else 0.0
            mem = ""
            if cfg.device == "cuda":
                peak_mib = max(torch.cuda.max_memory_allocated(d) for d in set(devices)) / 2**20
                mem = f" mem {peak_mib:,.0f}MiB"
            say(
                f"step {step}/{cfg.steps} loss {loss:.3f} acc {acc:.3f} tok/s {tok_s:,.0f} lr {lr:.1e}{mem}"
            )
            notifier.send(f"STATUS=step {step} loss {loss:.3f}")  # dflashd's status and report
            window_start, window_steps = time.monotonic(), 0
        stopping = bool(askers)
        if stopping:
            stop.at_boundary()  # the checkpoint below is local work: no deadline over it
        saving = step % cfg.checkpoint_every == 0 or stopping or step == cfg.steps
        if saving and leader:
            save_checkpoint(
                ckpt_path,
                {
                    "step": step,
                    "target": target.state_dict(),
                    "drafter": workers[0].drafter.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "torch_rng": torch.get_rng_state(),
                    "config": config_dict(cfg),
                    "loss": loss,
                },
            )
        if stopping:
            code, why = stop_outcome(askers, node, stop.event.is_set())
            say(f"stopped at step {step} (checkpoint {ckpt_path}){why}")
            return code
        boundary, last_boundary = time.monotonic(), boundary
        stop.step_took(boundary - last_boundary)
    final = ckpt_path.with_name(f"completed-step{step}.pt")
    if not leader:
        say(
            f"completed {step} steps (node rank {first_worker // cfg.workers}; rank 0 keeps the checkpoint)"
        )
        return 0
    if ckpt_path.exists():
        os.replace(ckpt_path, final)
    say(f"completed {step} steps; final checkpoint {final}")
    return 0
