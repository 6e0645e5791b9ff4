"""Worker threads: one per device slot, each compiling its attention on its own thread.

The protocol follows TRAINER-NOTES §4.5: each worker applies the compile config in its own
thread (Dynamo config became thread-local in torch 2.12), then runs its complete first step
(forward *and* backward) under one process-wide lock, because concurrent first calls
deadlocked on an H200.  Only when every worker is warm does the main thread forbid
recompilation (``set_stance("fail_on_recompile")``).

Which attention path ran is recorded per thread by evidence, not assumed: a counting
backend around Inductor counts compiled calls in the calling thread, the private flex
warning registry says whether the unfused flex path ran anywhere, and on a GPU the peak
memory is compared with what the dense scores would need.
"""

from __future__ import annotations

import contextvars
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from dflashd.trainer.data import Batch
from dflashd.trainer.mask import block_mask, dense_mask, dflash_mask_mod
from dflashd.trainer.model import (
    Drafter,
    ModelConfig,
    TargetModel,
    dense_core,
    flex_core,
    loss_and_accuracy,
)

COMPILE_LOCK = threading.Lock()
GRAPHS_BY_THREAD: Counter[str] = Counter()
_local = threading.local()


def compiled_calls() -> int:
    """Compiled-graph calls made by the current thread so far."""
    return int(getattr(_local, "calls", 0))


def counting_inductor(gm: torch.fx.GraphModule, example_inputs: list[Tensor]) -> Callable[..., Any]:
    """Inductor, plus a per-thread count of graphs compiled and of compiled calls made."""
    from torch._inductor.compile_fx import compile_fx

    GRAPHS_BY_THREAD[threading.current_thread().name] += 1
    compiled: Callable[..., Any] = compile_fx(gm, example_inputs)  # type: ignore[assignment]

    def run(*args: Any) -> Any:
        _local.calls = getattr(_local, "calls", 0) + 1
        return compiled(*args)

    run._boxed_call = getattr(compiled, "_boxed_call", False)  # type: ignore[attr-defined]
    return run


def apply_compile_config() -> dict[str, Any]:
    """Settings we rely on, applied in the calling thread (thread-local since torch 2.12); read back."""
    dyn = torch._dynamo.config
    if hasattr(dyn, "recompile_limit"):
        dyn.recompile_limit = 64
    if hasattr(dyn, "fail_on_recompile_limit_hit"):
        dyn.fail_on_recompile_limit_hit = True
    return {
        "recompile_limit": getattr(dyn, "recompile_limit", None),
        "fail_on_recompile_limit_hit": getattr(dyn, "fail_on_recompile_limit_hit", None),
    }


def flex_warning_seen() -> bool:
    """True once the unfused (dense) flex path ran anywhere in the process (TRAINER-NOTES §2.4)."""
    try:
        from torch.nn.attention import flex_attention as fa
    except ImportError:
        return False
    return "flex_attention_performance" in getattr(fa, "_WARNINGS_SHOWN", set())


@dataclass
class StepResult:
    """What a worker hands back after forward/backward."""

    loss: float
    acc: float
    compiled_calls: int
    seconds: float


@dataclass
class WarmupReport:
    """Per-worker evidence of which attention path ran."""

    worker: int
    device: str
    backend: str
    expected: str
    compile_s: float
    compiled_calls: int
    graphs: int
    peak_mem_mib: float | None
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def as_expected(self) -> bool:
        return self.backend == self.expected


class Worker:
    """One thread, one replica, one device."""

    def __init__(
        self,
        index: int,
        device: torch.device,
        cfg: ModelConfig,
        batch: int,
        blocks: int,
        *,
        attention: str,
        compile_attention: bool,
        target_state: dict[str, Tensor],
        drafter_state: dict[str, Tensor],
        inject_dense: bool = False,
        crash_at_step: int | None = None,
        hang_at_step: int | None = None,
    ) -> None:
        self.index = index
        self.device = device
        self.cfg = cfg
        self.batch = batch
        self.blocks = blocks
        self.attention = attention
        self.compile_attention = compile_attention
        self.inject_dense = inject_dense
        self.crash_at_step = crash_at_step
        self.hang_at_step = hang_at_step
        self.target = TargetModel(cfg).to(device)
        self.target.load_state_dict(target_state)
        self.target.requires_grad_(False)
        self.drafter = Drafter(cfg).to(device)
        self.drafter.load_state_dict(drafter_state)
        # A persistent anchors buffer: the mask_mod keeps one identity, so nothing recompiles per batch.
        self.anchors = torch.zeros(batch, blocks, dtype=torch.long, device=device)
        self.mask_mod = dflash_mask_mod(self.anchors, cfg.ctx_len, cfg.block_size)
        self.q_len = blocks * cfg.block_size
        self.kv_len = cfg.ctx_len + self.q_len
        eager = flex_core if attention == "flex" else dense_core
        self.eager_core = eager
        self.core: Callable[[Tensor, Tensor, Tensor, object], Tensor] = eager
        self._tasks: queue.SimpleQueue[tuple[str, Any] | None] = queue.SimpleQueue()
        self._results: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        # Copy the context so thread-local compile config (torch >= 2.12) starts from ours.
        ctx = contextvars.copy_context()
        self.thread = threading.Thread(
            target=ctx.run, args=(self._run,), name=f"worker-{index}", daemon=True
        )

    # -- thread side --------------------------------------------------------------------

    def _run(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.config = apply_compile_config()
        if self.compile_attention:
            self.core = torch.compile(
                self.eager_core, backend=counting_inductor, fullgraph=True, dynamic=False
            )
        while True:
            task = self._tasks.get()
            if task is None:
                return
            kind, payload = task
            try:
                if kind == "warmup":
                    self._results.put(("ok", self._warmup(payload)))
                else:
                    step, batch = payload
                    self._results.put(("ok", self._step(step, batch)))
            except BaseException as exc:  # handed to the main thread, which re-raises it
                self._results.put(("error", exc))

    def _mask(self, batch: Batch) -> object:
        self.anchors.copy_(batch.anchors.to(self.device, non_blocking=True))
        if self.attention == "flex":
            return block_mask(self.mask_mod, self.batch, self.q_len, self.kv_len, self.device)
        return dense_mask(self.mask_mod, self.batch, self.q_len, self.kv_len, self.device)

    def _forward_backward(self, batch: Batch) -> tuple[Tensor, Tensor]:
        mask = self._mask(batch)
        context = batch.context.to(self.device, non_blocking=True)
        block_inputs = batch.block_inputs.to(self.device, non_blocking=True)
        labels = batch.labels.to(self.device, non_blocking=True)
        features = self.target.features(context)
        core = self.eager_core if self.inject_dense else self.core
        logits = self.drafter(features, block_inputs, self.target, core, mask)
        loss, acc = loss_and_accuracy(logits, labels)
        loss.backward()
        return loss.detach(), acc.detach()

    def _warmup(self, batch: Batch) -> WarmupReport:
        """The complete first step under the compile lock; then report which path ran, by evidence."""
        with COMPILE_LOCK:
            started = time.monotonic()
            before_calls = compiled_calls()
            before_graphs = GRAPHS_BY_THREAD[threading.current_thread().name]
            if self.device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(self.device)
            self._forward_backward(batch)
            self.drafter.zero_grad(set_to_none=False)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            seconds = time.monotonic() - started
        calls = compiled_calls() - before_calls
        graphs = GRAPHS_BY_THREAD[threading.current_thread().name] - before_graphs
        peak = (
            torch.cuda.max_memory_allocated(self.device) / 2**20
            if self.device.type == "cuda"
            else None
        )
        return WarmupReport(
            worker=self.index,
            device=str(self.device),
            backend=self._observed_backend(calls),
            expected=self.expected_backend,
            compile_s=seconds,
            compiled_calls=calls,
            graphs=graphs,
            peak_mem_mib=peak,
            config=self.config,
        )

    @property
    def expected_backend(self) -> str:
        kind = "flex" if self.attention == "flex" else "dense"
        return f"{kind}_compiled" if self.compile_attention else f"{kind}_eager"

    def _observed_backend(self, calls: int) -> str:
        kind = "flex" if self.attention == "flex" else "dense"
        if kind == "flex" and flex_warning_seen():
            return "dense_fallback"  # the unfused flex path materialised the scores somewhere
        if self.compile_attention and calls < self.cfg.draft_layers:
            return "dense_fallback" if kind == "flex" else "dense_eager"
        return f"{kind}_compiled" if calls >= self.cfg.draft_layers else f"{kind}_eager"

    def _step(self, step: int, batch: Batch) -> StepResult:
        if self.crash_at_step is not None and step >= self.crash_at_step:
            raise RuntimeError(f"injected crash at step {step} in worker {self.index}")
        if self.hang_at_step is not None and step >= self.hang_at_step:
            self._hang_here()
        started = time.monotonic()
        before = compiled_calls()
        loss, acc = self._forward_backward(batch)
        return StepResult(
            float(loss), float(acc), compiled_calls() - before, time.monotonic() - started
        )

    def _hang_here(self) -> None:
        """Injected: this worker thread hangs; on a GPU inside the CUDA runtime (a kernel that
        spins for a day, then a synchronize: what a rank waiting on a dead peer looks like)."""
        if self.device.type == "cuda":
            with torch.cuda.device(self.device):
                torch.cuda._sleep(1 << 62)
                torch.cuda.synchronize(self.device)
        while True:
            time.sleep(1.0)

    # -- main-thread side ---------------------------------------------------------------

    def start(self) -> None:
        self.thread.start()

    def submit_warmup(self, batch: Batch) -> None:
        self._tasks.put(("warmup", batch))

    def submit_step(self, step: int, batch: Batch) -> None:
        self._tasks.put(("step", (step, batch)))

    def result(self, timeout: float | None = None) -> Any:
        status, value = self._results.get(timeout=timeout)
        if status == "error":
            raise value
        return value

    def stop(self) -> None:
        self._tasks.put(None)
