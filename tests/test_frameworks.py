"""Issue 22: real frameworks' output read right, and a runtime crash never taken for an early death.

The pure half table-tests the formats, the global step and the stall window on lines taken
from the frameworks' sources and issue threads.  The other half runs real children that
print those lines (with ``\\r`` where they redraw) under a real daemon.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from dflashd.logs import EventRecord, LineRecord
from dflashd.supervisor.model.formats import match_line
from dflashd.supervisor.model.progress import global_step, stall_window
from dflashd.supervisor.model.verdicts import reason_from_output
from tests.conftest import Daemon, child, run_cli

Start = Callable[..., Daemon]


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        # Lightning's TQDM bar: the batch in epoch 1 of 6
        (
            "Epoch 1:  17%|█▋        | 1/6 [00:00<00:01,  4.47it/s, v_num=0]",
            {"format": "lightning", "step": 1, "epoch_index": 1, "batches": 6},
        ),
        # Lightning's RichProgressBar, as written once at the end on a pipe
        (
            "Epoch 3/-2 ━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━ 8/8 0:00:00 • 0:00:00 14.95it/s v_num: 0.000",
            {"format": "lightning", "step": 8, "epoch_index": 3, "batches": 8},
        ),
        # the same with the loss Lightning logs on_step (Rich draws it in italics: escapes)
        (
            "\x1b[2KEpoch 1/1  \x1b[35m━━━━━━━━━━━━━━━━━\x1b[0m 32/32 \x1b[2m0:00:01 • 0:00:00\x1b[0m"
            " \x1b[3mv_num: 0 train_loss_step: 0.112 train_loss_epoch: 0.300\x1b[0m",
            {"format": "lightning", "step": 32, "loss": 0.112},
        ),
        (
            "Epoch 3/-2 ━━━━━━━━━━━━━━━━━━━━ 8/8 0:00:00 • 0:00:00 14.95it/s train_loss: 0.112",
            {"format": "lightning", "step": 8, "loss": 0.112},
        ),
        # PyTorch's MNIST example: 1-based epochs, [seen/total]
        (
            "Train Epoch: 1 [640/3200 (20%)]\tLoss: 0.107590",
            {"format": "pytorch_examples", "step": None, "epoch": 0.2, "loss": 0.10759},
        ),
        # PyTorch's DDP tutorial
        (
            "[GPU0] Epoch 3 | Batchsize: 32 | Steps: 64",
            {"format": "pytorch_examples", "epoch": 3.0},
        ),
        # Hugging Face Trainer: 5.x quotes the values, 4.x does not
        (
            "{'loss': '5.388', 'grad_norm': '0.7782', 'learning_rate': '4.5e-05', 'epoch': '0.5'}",
            {"format": "hf_trainer", "loss": 5.388, "epoch": 0.5},
        ),
        (
            "{'loss': 2.3018, 'grad_norm': 0.7782, 'learning_rate': 4.5e-05, 'epoch': 0.25}",
            {"format": "hf_trainer", "loss": 2.3018, "epoch": 0.25},
        ),
        ("{'eval_loss': 2.1, 'eval_runtime': 0.3, 'epoch': 1.0}", None),
        ("{'train_runtime': '1.2', 'train_loss': '4.9', 'epoch': '1'}", None),
        # DeepSpeed: step=0 at initialize() is not a step; a later one is
        (
            "[2025-03-11 02:06:59,001] [INFO] [logging.py:128:log_dist] [Rank 0] step=0, skipped=0, lr=[0.001]",
            None,
        ),
        ("[Rank 0] step=100, skipped=0, lr=[0.001], mom=[(0.9, 0.999)]", {"step": 100}),
        # a number inside an error line names a step, takes none
        ("RuntimeError: injected crash after step 30", None),
        ("ValueError: bad value at step 31", None),
        ("saved a checkpoint after step 30", None),
        ("step 12 loss 2.31", {"format": "plain", "step": 12, "loss": 2.31}),
        # an evaluation's own step and loss are never the run's (issue 50)
        ("[eval] step 10 loss 3.2", None),
        ("Validation step 3: loss nan", None),
        ("step 250: val loss 2.5, train loss 1.9", {"step": 250, "loss": 1.9}),
        ("step 250: train loss 1.9, val loss nan", {"step": 250, "loss": 1.9}),
        ("step 100 | eval_loss nan | val_loss inf", {"step": 100, "loss": None}),
        ("step 100 eval loss: nan", {"step": 100, "loss": None}),
        # Hugging Face's evaluation bar has no description: its total says it (Progress)
        (" 80%|████████  | 40/50 [00:01<00:00, 30.1it/s]", {"format": "tqdm", "total": 50}),
    ],
)
def test_real_lines(line: str, expected: dict[str, Any] | None) -> None:
    found = match_line(line)
    if expected is None:
        assert found is None
        return
    assert found is not None
    for key, value in expected.items():
        assert getattr(found, key) == value, (key, found)


@pytest.mark.parametrize(
    ("epoch", "batch", "batches", "full", "expected"),
    [
        (0, 1, 6, 6, 1),
        (1, 1, 6, 6, 7),
        (2, 6, 6, 6, 18),
        (3, 2, 4, 6, 20),  # the last epoch is shorter: earlier epochs still count 6
        (5, 0, 6, 0, 30),
    ],
)
def test_global_step_of_an_epoch_bar(
    epoch: int, batch: int, batches: int, full: int, expected: int
) -> None:
    assert global_step(epoch, batch, batches, full) == expected


@pytest.mark.parametrize(
    ("timeout", "intervals", "expected"),
    [
        (900.0, (), 900.0),
        (900.0, (10.0, 12.0), 900.0),  # a fast job: the configured window
        (900.0, (1000.0, 1010.0, 990.0), 3030.0),  # logs every 100 steps of 10 s
        (900.0, (5.0,) * 19 + (400.0,), 1200.0),  # one slow interval among the last 20
    ],
)
def test_the_stall_window_follows_the_jobs_cadence(
    timeout: float, intervals: tuple[float, ...], expected: float
) -> None:
    assert stall_window(timeout, intervals) == expected


def test_reasons_read_through_the_rank_prefix() -> None:
    tail = (
        "[rank0]: Traceback (most recent call last):",
        '[rank0]:   File "train.py", line 12, in <module>',
        "[rank0]: RuntimeError: Expected all tensors to be on the same device",
    )
    assert reason_from_output(tail) == "RuntimeError"


# -- real children under a real daemon ---------------------------------------------------


def _exit(daemon: Daemon) -> dict[str, Any]:
    exits = daemon.events("exit")
    assert exits, daemon.records()[-5:]
    return dict(exits[-1].fields)


def test_a_silent_rich_bar_crash_after_a_life_is_crashed(start_daemon: Start) -> None:
    """Lightning with rich on a pipe prints no step; it computes for 3 s (early_death_s = 2)
    and dies: crashed, no_step_seen, not an early death (no cache clearing)."""
    daemon = start_daemon(
        child("framework_lines.py", "lightning_rich_silent", "3"),
        restart={"early_retries": 0, "runtime_retries": 0, "early_death_s": 2.0},
    )
    daemon.wait(60)
    fields = _exit(daemon)
    assert fields["verdict"] == "crashed" and fields["reason"] == "RuntimeError:no_step_seen"
    assert daemon.events("first_step") == []
    assert daemon.events("fatal")[0].fields["reason"] == "runtime_retries_exhausted"


def test_a_real_rich_bar_is_seen_through_the_pipe(start_daemon: Start) -> None:
    """rich (Lightning's default bar when installed) draws live into dflashd's pipe: the steps
    are seen, and a crash at step 5 is a runtime crash."""
    pytest.importorskip("rich")
    daemon = start_daemon(
        child("framework_lines.py", "rich_bar_crash"), restart={"runtime_retries": 0}
    )
    daemon.wait(60)
    assert daemon.events("first_step")[0].fields["source"] == "lightning"
    fields = _exit(daemon)
    assert fields["verdict"] == "crashed" and fields["step"] == 5
    assert fields["reason"] == "RuntimeError"


def test_lightnings_bar_gives_the_global_step(start_daemon: Start) -> None:
    daemon = start_daemon(child("framework_lines.py", "lightning_tqdm"))
    assert daemon.wait(60) == 0
    fields = _exit(daemon)
    assert fields["verdict"] == "completed" and fields["step"] == 18  # 3 epochs of 6 batches
    steps = [e.fields["step"] for e in daemon.events("progress")]
    assert steps == sorted(steps) and steps[-1] == 18


@pytest.mark.parametrize(("name", "last_epoch"), [("mnist", 1.8), ("ddp_tutorial", 3.0)])
def test_epoch_lines_report_the_epoch(start_daemon: Start, name: str, last_epoch: float) -> None:
    daemon = start_daemon(child("framework_lines.py", name))
    assert daemon.wait(60) == 0
    assert daemon.events("first_step")
    epochs = [e.fields.get("epoch") for e in daemon.events("progress")]
    assert epochs and epochs[-1] == last_epoch and epochs == sorted(epochs)
    status = run_cli("status", "--json", "--home", str(daemon.home))
    assert '"epoch":' in status.stdout.replace(" ", "")


def test_hf_trainers_quoted_loss_is_read_and_clears_leave_no_blank_lines(
    start_daemon: Start,
) -> None:
    daemon = start_daemon(child("framework_lines.py", "hf_trainer"), restart={"early_retries": 0})
    daemon.wait(60)
    losses = [e.fields.get("loss") for e in daemon.events("progress") if "loss" in e.fields]
    assert losses and losses[-1] == pytest.approx(3.388)
    fields = _exit(daemon)
    assert fields["verdict"] == "crashed" and fields["step"] == 20
    assert all(line.strip() for line in fields["tail"])
    bars = [line for line in fields["tail"] if "|" in line and "/20 [" in line]
    assert len(bars) <= 1  # the bar's redraws collapse to its last state
    blank = [r for r in daemon.records() if isinstance(r, LineRecord) and not r.line.strip()]
    assert blank  # the log stays byte-faithful...
    shown = run_cli("tail", "--home", str(daemon.home), "-n", "1000").stdout.splitlines()
    assert all(
        line.split(" out ", 1)[-1].strip() for line in shown if " out " in line
    )  # ...tail skips them


def test_deepspeed_step_0_at_init_is_not_a_step(start_daemon: Start) -> None:
    daemon = start_daemon(
        child("framework_lines.py", "deepspeed_init_crash"), restart={"early_retries": 0}
    )
    daemon.wait(60)
    assert daemon.events("first_step") == []
    assert _exit(daemon)["verdict"] == "crash_before_first_step"


def test_rank_prefixed_traceback_gives_its_reason(start_daemon: Start) -> None:
    daemon = start_daemon(
        child("framework_lines.py", "rank_prefixed_crash"), restart={"early_retries": 0}
    )
    daemon.wait(60)
    assert _exit(daemon)["reason"] == "RuntimeError"


def test_an_error_naming_a_step_is_not_a_first_step(start_daemon: Start) -> None:
    daemon = start_daemon(
        child("framework_lines.py", "error_names_step"), restart={"early_retries": 0}
    )
    daemon.wait(60)
    assert daemon.events("first_step") == []
    fields = _exit(daemon)
    assert fields["verdict"] == "crash_before_first_step" and fields["reason"] == "ValueError"


@pytest.mark.parametrize("custody", ["auto", "pidfd"])
def test_a_silent_cpu_bound_start_is_alive(
    start_daemon: Start, custody: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No output for 5 s, a CPU busy (stall_timeout_s = 2): its CPU time (the run's cgroup, or
    its process tree) keeps it alive until it completes."""
    monkeypatch.setenv("DFLASHD_CUSTODY", custody)
    job = "import time\nend = time.time() + 5\nwhile time.time() < end: pass\nprint('done')\n"
    daemon = start_daemon(["python3", "-c", job], stall_timeout_s=2.0)
    assert daemon.wait(60) == 0
    assert daemon.events("ending_run") == []
    assert _exit(daemon)["verdict"] == "completed"


def test_torch_extensions_stay_in_torchs_own_directory(start_daemon: Start) -> None:
    """JIT-built ops (DeepSpeed's) are shared by every home: dflashd leaves their directory alone."""
    daemon = start_daemon(child("exit_silent.py"), restart={"early_retries": 0})
    daemon.wait(60)
    spawn = daemon.events("spawn")[0]
    assert "TORCH_EXTENSIONS_DIR" not in spawn.fields["env_keys"]
    assert "TORCHINDUCTOR_CACHE_DIR" in spawn.fields["env_keys"]
    assert isinstance(spawn, EventRecord)


def test_an_evaluation_bar_nested_in_training_is_alive_not_steps() -> None:
    """Hugging Face's Trainer draws its evaluation bar (no description, its own total) under
    the training bar: its batches never move the run's step back, nor feed the pace."""
    from dflashd.supervisor.model.progress import Progress

    p = Progress(started_mono=0.0)
    for now, (step, total) in enumerate(
        [(100, 1000), (200, 1000), (10, 50), (40, 50), (300, 1000)]
    ):
        p, _change = p.on_step(float(now), step=step, first=True, source="tqdm", bar_total=total)
        assert p.step == (step if total == 1000 else 200)
    assert p.bar_total == 1000 and p.last_alive_mono == 4.0
    assert len(p.intervals) == 2  # 100 -> 200 -> 300; the evaluation's batches are not steps


def test_an_evaluation_bar_beside_printed_steps_is_alive_not_steps() -> None:
    """A job that prints ``step N loss X`` and draws a bar to evaluate: the bar's batches
    never take the run's step back."""
    from dflashd.supervisor.model.progress import Progress

    p = Progress(started_mono=0.0)
    p, _ = p.on_step(0.0, step=100, first=True, source="plain", loss=2.0)
    p, _ = p.on_step(1.0, step=50, first=True, source="tqdm", bar_total=50)
    assert p.step == 100 and p.step_source == "plain" and p.last_alive_mono == 1.0


def test_a_nan_posted_under_an_evaluation_bar_still_starts_the_divergence() -> None:
    """The job's loss turns NaN at step 250 and it evaluates there: the post that carries the
    NaN line has the evaluation bar as its newest line (its batches, its total).  The NaN is
    still judged, with its own step: the divergence is dated to step 250, not a step late
    (seen once in CI under load, issue 53)."""
    from dflashd.supervisor.model.progress import Progress

    nan = float("nan")
    p = Progress(started_mono=0.0)
    for now, step in enumerate(range(201, 227)):
        p, _ = p.on_step(float(now), step=step, first=True, source="plain", loss=1.0)
    p, _ = p.on_step(30.0, step=50, first=True, source="tqdm", bar_total=50)  # an evaluation
    p, change = p.on_step(
        31.0,
        step=50,
        first=True,
        source="tqdm",
        bar_total=50,
        loss=nan,
        losses_from_nan=((250, nan),),
    )  # step 250's NaN line, then the evaluation's bar, posted together
    assert p.step == 226 and not change.diverged  # the bar is no step; one NaN is no streak
    for now, step in ((32.0, 251), (33.0, 252)):
        p, change = p.on_step(
            now, step=step, first=True, source="plain", loss=nan, losses_from_nan=((step, nan),)
        )
    assert change.diverged and p.losses.diverged_at == 250, p.losses


def test_lightnings_rich_metrics_wrapped_after_the_bar_give_the_loss() -> None:
    """Issue 54: Rich wraps the metrics onto the next line, ``v_num`` first: the training
    loss there is read, a ``val_loss`` never."""
    from dflashd.supervisor.model.formats import FormatMatcher

    bar = "Epoch 0/9  ━━━━━━━━━━━━━━━━ 12/18 0:00:17 • 0:01:02 4.47it/s"
    found = FormatMatcher().last_step([bar, "v_num: 0.000 train_loss: 0.112"])
    assert found is not None and found.step == 12 and found.loss == 0.112
    wrapped = FormatMatcher().last_step([bar, "v_num: 0.000 val_loss: 0.9"])
    assert wrapped is not None and wrapped.loss is None
