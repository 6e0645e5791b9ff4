"""One training session: configured, joined to its process group, its workers started,
warmed up (each worker compiles its first step), then handed to :func:`loop.train`."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

import torch

from dflashd.trainer.data import MarkovChain, SequencePool, make_batch
from dflashd.trainer.distributed import Node, join, leave, local_device_slots, share_resume
from dflashd.trainer.loop import Session, train
from dflashd.trainer.model import Drafter, ModelConfig, TargetModel
from dflashd.trainer.notify import Notifier
from dflashd.trainer.stopping import Stop
from dflashd.trainer.train import (
    EX_CONFIG,
    Injection,
    RecompileBlocked,
    TrainConfig,
    build_config,
    checkpoint_dir,
    config_dict,
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


def run(args: argparse.Namespace, stop: Stop, inject: Injection) -> int:
    """Configure, join the process group (under torchrun), train, leave; the exit code."""
    notifier = Notifier()
    stop.doing = "looking for GPUs"
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
    stop.doing = "joining the process group" if os.environ.get("WORLD_SIZE") else "setting up"
    node = join(cfg.device, args.dist_timeout_s)
    code, error = 1, None
    try:
        code = _with_workers(args, stop, inject, cfg, node, devices, notifier)
        return code
    except BaseException as exc:
        code, error = (EX_CONFIG if isinstance(exc, RecompileBlocked) else 1), exc
        raise
    finally:
        if node is not None:
            stop.bound_exit(code, error, "leaving the process group and exiting")
        leave(node)


def _with_workers(
    args: argparse.Namespace,
    stop: Stop,
    inject: Injection,
    cfg: TrainConfig,
    node: Node | None,
    devices: list[torch.device],
    notifier: Notifier,
) -> int:
    mcfg = model_config(cfg)
    stop.doing = "building the model and loading the checkpoint"
    torch.manual_seed(cfg.seed)
    target, drafter = TargetModel(mcfg), Drafter(mcfg)
    ckpt_path = checkpoint_dir(args) / "latest.pt"
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
        torch.set_rng_state(resume["torch_rng"])
        say(f"resumed from {ckpt_path} at step {int(resume['step'])}")
    where = f", node rank {node.rank} of {node.world_size} ({node.backend})" if node else ""
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
            inject_dense=inject.kind == "dense_fallback" and i == 0,
            crash_at_step=inject.crash_step
            if inject.kind == "crash_at_step" and i == inject.crash_worker
            else None,
            hang_at_step=inject.crash_step
            if inject.kind == "hang_at_step" and i == inject.crash_worker
            else None,
        )
        for i, dev in enumerate(devices)
    ]
    stop.doing = "warming up (compiling the attention)" if cfg.compile else "warming up"
    for w in workers:
        w.start()
    try:
        session = _session(
            cfg, mcfg, workers, target, resume, ckpt_path, notifier, stop, inject, node
        )
        return warm_up(session) or train(session)
    finally:
        # Worker threads must be gone before the interpreter exits, or torch aborts the process.
        for w in workers:
            w.stop()
        for w in workers:
            w.thread.join(timeout=30)


def _session(
    cfg: TrainConfig,
    mcfg: ModelConfig,
    workers: list[Worker],
    target: TargetModel,
    resume: dict[str, Any] | None,
    ckpt_path: Path,
    notifier: Notifier,
    stop: Stop,
    inject: Injection,
    node: Node | None,
) -> Session:
    # Across nodes every worker thread has its own data: global index = rank * workers + local.
    first_worker = node.rank * cfg.workers if node is not None else 0
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

    return Session(
        cfg,
        mcfg,
        workers,
        target,
        optimizer,
        batch_for,
        int(resume["step"]) if resume is not None else 0,
        ckpt_path,
        notifier,
        stop,
        inject,
        node,
        world_size=node.world_size if node is not None else 1,
        leader=node is None or node.leader,
    )


def warm_up(s: Session) -> int | None:
    """Every worker compiles its own first step (forward and backward), one at a time.

    Returns an exit code when training must not start (an unintended attention path under
    ``--require-flex``), else None.
    """
    started = time.monotonic()
    reports: list[WarmupReport] = []
    for w in s.workers:
        s.notifier.send(f"EXTEND_TIMEOUT_USEC={600 * 1_000_000}\nSTATUS=compiling worker {w.index}")
        say(f"compile_start worker={w.index} device={w.device}")
        w.submit_warmup(s.batch_for(s.start_step, w.index))
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
        s.notifier.send(f"STATUS=dense fallback: {detail}")
        if s.cfg.require_flex:
            say("--require-flex: refusing to train on an unintended attention path (exit 78)")
            return EX_CONFIG
    if s.cfg.compile:
        torch.compiler.set_stance("fail_on_recompile")
    stance = "fail_on_recompile" if s.cfg.compile else "eager"
    say(f"warmup_all_done secs={time.monotonic() - started:.2f} stance={stance}")
    if s.inject.kind == "crash_before_first_step":
        raise RuntimeError("injected crash before the first step")
    if s.inject.kind == "oom":
        if s.cfg.device == "cuda":
            torch.empty(1 << 50, dtype=torch.uint8, device=s.devices[0])
        raise torch.OutOfMemoryError("injected: CUDA out of memory (simulated on CPU)")
    return None
