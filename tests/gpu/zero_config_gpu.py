"""Zero-config supervision on a real GPU (run by tests/gpu/run_gpu_checks.sh).

1. A silent job keeping the GPU busy (matmuls, prints nothing), default config: seen
   `training` from NVML (first_step source gpu), and how long that took.
2. The GPU's utilisation while torch.compile compiles (the bundled trainer's warm-up, seen by
   NVML every 0.5 s): the longest run of polls at >= 60 %, against gpu_busy_s = 30.
3. Real trainers nobody here wrote, unmodified, under the default config: PyTorch Lightning's
   TQDM bar and Hugging Face's Trainer (a tiny model built from a config: no download).
Writes $OUT/zero_config_gpu.json.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

from dflashd.logs import EventRecord, read_records
from dflashd.supervisor.watch.nvml import NvmlSampler

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: find tests/
from tests.helpers import daemon_argv

RESULTS: dict[str, Any] = {}

BUSY_JOB = textwrap.dedent(
    """
    import torch
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    while True:
        for _ in range(50):
            a = (a @ a).clamp_(-1, 1)
        torch.cuda.synchronize()
    """
)

LIGHTNING_JOB = textwrap.dedent(
    """
    import torch, lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1))
        def training_step(self, batch, _):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.log("train_loss", loss, prog_bar=True)
            return loss
        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), 1e-3)

    data = TensorDataset(torch.randn(4096, 256), torch.randn(4096, 1))
    trainer = L.Trainer(max_epochs=3, accelerator="gpu", devices=1, logger=False, enable_checkpointing=False)
    trainer.fit(Tiny(), DataLoader(data, batch_size=32))
    """
)

HF_JOB = textwrap.dedent(
    """
    import torch
    from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

    config = BertConfig(vocab_size=1000, hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256)
    model = BertForSequenceClassification(config)

    class Data(torch.utils.data.Dataset):
        def __len__(self):
            return 2048
        def __getitem__(self, i):
            g = torch.Generator().manual_seed(i)
            return {"input_ids": torch.randint(0, 1000, (64,), generator=g), "labels": i % 2}

    args = TrainingArguments(output_dir="hf-out", per_device_train_batch_size=32, num_train_epochs=2,
                             logging_steps=10, save_strategy="no", report_to=[])
    Trainer(model=model, args=args, train_dataset=Data()).train()
    """
)


def say(text: str) -> None:
    print(text, flush=True)


def supervise(
    work: Path, name: str, script: str, timeout_s: float, **config: Any
) -> dict[str, Any]:
    """Run ``script`` under `dflashd start --foreground` with a mostly default config."""
    stop_after_first_step = bool(config.pop("stop_after_first_step", False))
    home = work / f"{name}-home"
    job = work / f"job_{name}.py"  # not lightning.py: that name would shadow the package
    job.write_text(script)
    cfg = work / f"{name}.toml"
    lines = [f"{k} = {json.dumps(v)}" for k, v in config.items()]
    cfg.write_text("\n".join(lines) + "\n")
    argv = daemon_argv(home, cfg, [sys.executable, str(job)])
    started = time.monotonic()
    proc = subprocess.Popen(argv, cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    first: EventRecord | None = None
    status: dict[str, Any] = {}
    deadline = started + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.5)  # polling the daemon's own files from outside: no event to wait on
        logs = home / "logs"
        if first is None and logs.is_dir():
            first = next(
                (
                    r
                    for r in read_records(logs)
                    if isinstance(r, EventRecord) and r.event == "first_step"
                ),
                None,
            )
            if first is not None:
                out = subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "dflashd.supervisor",
                        "status",
                        "--home",
                        str(home),
                        "--json",
                    ],
                    capture_output=True,
                    text=True,
                    check=False,
                )
                status = json.loads(out.stdout or "{}")
                if stop_after_first_step:
                    break
    if proc.poll() is None:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "dflashd.supervisor",
                "stop",
                "--home",
                str(home),
                "--timeout",
                "5",
            ],
            capture_output=True,
            check=False,
        )
    proc.wait(60)
    exits = [
        r.fields
        for r in read_records(home / "logs")
        if isinstance(r, EventRecord) and r.event == "exit"
    ]
    return {
        "first_step_source": first.fields.get("source") if first else None,
        "first_step_after_s": first.fields.get("after_s") if first else None,
        "status_phase": status.get("phase"),
        "status_step_source": status.get("step_source"),
        "status_step": status.get("step"),
        "gpus": status.get("gpus"),
        "verdicts": [(e.get("verdict"), e.get("reason")) for e in exits],
        "last_tail": (exits[-1].get("tail") or [])[-6:] if exits else [],
        "daemon_exit": proc.returncode,
    }


def busy_silent_job(work: Path) -> None:
    result = supervise(work, "busy", BUSY_JOB, 120, stop_after_first_step=True)
    RESULTS["silent_busy_job"] = result
    say(f"silent busy job: {result}")


def compile_utilisation(work: Path) -> None:
    """NVML utilisation every 0.5 s while the bundled trainer compiles, until its first step line."""
    sampler = NvmlSampler("all")
    samples: list[tuple[float, float]] = []
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            reading = sampler.sample()[0]
            samples.append((time.monotonic(), reading.utilization_pct or 0.0))
            done.wait(0.5)

    poller = threading.Thread(target=poll)
    poller.start()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dflashd.trainer",
            "--steps",
            "30",
            "--checkpoint-dir",
            str(work / "ck"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    started = time.monotonic()
    first_step_at = None
    for line in proc.stdout:
        if line.startswith("step ") and first_step_at is None:
            first_step_at = time.monotonic()
    proc.wait()
    proc.stdout.close()
    done.set()
    poller.join()
    sampler.close()
    warm = [(t, u) for t, u in samples if first_step_at is None or t < first_step_at]
    longest = streak = 0.0
    prev_t = None
    for t, u in warm:
        if u >= 60:
            streak += (t - prev_t) if prev_t is not None and streak > 0 else 0.5
            longest = max(longest, streak)
        else:
            streak = 0.0
        prev_t = t
    RESULTS["compile_warmup"] = {
        "warmup_s": round((first_step_at or time.monotonic()) - started, 1),
        "polls": len(warm),
        "polls_at_or_above_60pct": sum(1 for _, u in warm if u >= 60),
        "longest_busy_streak_s": round(longest, 1),
        "max_util_pct": max((u for _, u in warm), default=None),
    }
    say(f"compile warm-up utilisation: {RESULTS['compile_warmup']}")


def real_trainers(work: Path) -> None:
    for name, script in (("lightning", LIGHTNING_JOB), ("hf_trainer", HF_JOB)):
        try:
            result = supervise(work, name, script, 240)
        except Exception as exc:  # a missing package there is a result too
            result = {"error": repr(exc)}
        RESULTS[name] = result
        say(f"{name}: {result}")


def main() -> None:
    only = sys.argv[1:]
    with tempfile.TemporaryDirectory(prefix="dflashd-zc-") as tmp:
        work = Path(tmp)
        for check in (busy_silent_job, compile_utilisation, real_trainers):
            if only and check.__name__ not in only:
                continue
            try:
                check(work)
            except Exception as exc:
                RESULTS[check.__name__] = {"error": repr(exc)}
                say(f"{check.__name__} failed: {exc!r}")
    out = os.environ.get("OUT")
    if out:
        Path(out, "zero_config_gpu.json").write_text(json.dumps(RESULTS, indent=2))


if __name__ == "__main__":
    main()
