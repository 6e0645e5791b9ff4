"""Zero configuration: an unmodified trainer, supervised with the default config, judged right.

Real children print each trainer's real step format (``tests/children/formats.py``); no
pattern and no sd_notify are configured.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from dflashd.supervisor.model.formats import match_line
from tests.conftest import Daemon, child, daemon_argv, run_cli, write_config

Start = Callable[..., Daemon]

FORMATS_WITH_STEPS = [
    "nanogpt",
    "megatron",
    "torchtitan",
    "deepspeed",
    "lightning",
    "tqdm",
    "plain",
]


@pytest.mark.parametrize("fmt", [*FORMATS_WITH_STEPS, "pytorch_examples"])
def test_each_format_is_training_and_a_later_crash_is_crashed(
    start_daemon: Start, fmt: str
) -> None:
    """8 steps in the trainer's own format, then a crash: first step from the format, verdict crashed."""
    daemon = start_daemon(child("formats.py", fmt, "8", "crash"), restart={"runtime_retries": 0})
    assert daemon.wait() == 4
    first = daemon.events("first_step")[0]
    assert first.fields["source"] == fmt
    exit_rec = daemon.events("exit")[0]
    assert exit_rec.fields["verdict"] == "crashed", exit_rec.fields
    if fmt in FORMATS_WITH_STEPS:
        assert exit_rec.fields["step"] == 8
    assert daemon.events("cache_cleared") == []


def test_status_names_the_source_and_the_step_while_training(
    start_daemon: Start, home: Path
) -> None:
    """status --json and text: phase training, the step, and which format decided it."""
    daemon = start_daemon(child("formats.py", "nanogpt", "5", "hang"))
    daemon.wait_event("first_step")
    daemon.wait_for(lambda r: getattr(r, "line", "").startswith("iter 5:"))
    deadline = time.monotonic() + 10
    status: dict[str, object] = {}
    while time.monotonic() < deadline:  # the status object is polled over the control socket
        status = json.loads(run_cli("status", "--home", str(home), "--json").stdout)
        if status.get("step") == 5:
            break
    assert status["phase"] == "training" and status["step"] == 5
    assert status["first_step_source"] == "nanogpt" and status["step_source"] == "nanogpt"
    assert status["last_line"].startswith("iter 5:")
    text = run_cli("status", "--home", str(home)).stdout
    assert "step 5" in text and "nanogpt" in text


def test_busy_job_in_an_unknown_format_is_never_ended_by_the_first_step_timeout(
    start_daemon: Start,
) -> None:
    """Output no format knows, for 6x first_step_timeout_s: it completes, never stalled."""
    daemon = start_daemon(child("busy_unknown.py", "3"), first_step_timeout_s=0.5)
    assert daemon.wait() == 0
    assert [e.fields["verdict"] for e in daemon.events("exit")] == ["completed"]
    assert daemon.events("ending_run") == []


def test_immediate_import_error_start_shows_it_and_gives_up(home: Path, tmp_path: Path) -> None:
    """dflashd start of a job dying of an ImportError: non-zero, the traceback shown, one launch, fatal."""
    config = write_config(tmp_path / "c.toml", {"gpus": "none"})
    result = run_cli(
        "start", "--home", str(home), "--config", str(config), "--", *child("import_error.py")
    )
    assert result.returncode == 4, result.stdout + result.stderr
    assert "crash_before_first_step (import_error)" in result.stderr
    assert "ModuleNotFoundError" in result.stderr
    assert "fatal: unfixable_import_error" in result.stderr
    records = run_cli("tail", "--home", str(home), "-n", "100", "--json").stdout.splitlines()
    events = [json.loads(r).get("event") for r in records]
    assert events.count("spawn") == 1 and "fatal" in events and "cache_cleared" not in events


def test_retry_unfixable_switch_retries_an_import_error(start_daemon: Start) -> None:
    """restart.retry_unfixable = true: the ImportError goes through the early budget like any death."""
    daemon = start_daemon(
        child("import_error.py"), restart={"early_retries": 2, "retry_unfixable": True}
    )
    assert daemon.wait() == 4
    assert len(daemon.events("spawn")) == 3
    assert daemon.events("fatal")[0].fields["reason"] == "early_retries_exhausted"


def test_detached_start_of_a_working_job_says_it_runs(home: Path, tmp_path: Path) -> None:
    """A job that prints and keeps going, showing no step: start waits start_wait_s, then exits 0
    quoting its last line."""
    config = write_config(tmp_path / "c.toml", {"gpus": "none", "start_wait_s": 1.5})
    try:
        result = run_cli(
            "start",
            "--home",
            str(home),
            "--config",
            str(config),
            "--",
            *child("prints_then_waits.py"),
        )
        assert result.returncode == 0, result.stderr
        assert "is running, no step seen in 1.5s (last line: hello from the job" in result.stdout
    finally:
        run_cli("stop", "--home", str(home), "--timeout", "2")


def test_foreground_shows_the_jobs_output_as_it_comes(home: Path, tmp_path: Path) -> None:
    """start --foreground prints the job's lines, prefixed by run and stream, while it runs."""
    config = write_config(tmp_path / "c.toml", {"gpus": "none"})
    argv = daemon_argv(home, config, flags=())
    proc = subprocess.Popen(
        [*argv, "--", *child("prints_then_waits.py")],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        # stdout is the job's lines alone; dflashd's own events go to stderr, in the same
        # prefixed form (``r1 dflashd | launched ...``), so ``2>&1 | tee`` holds one format
        first = proc.stdout.readline()
        assert first == "r1 out | hello from the job\n", first
    finally:
        run_cli("stop", "--home", str(home), "--timeout", "2")
        proc.wait(20)
        if proc.stdout is not None:
            proc.stdout.close()


def test_home_is_accepted_before_the_command(home: Path, tmp_path: Path) -> None:
    """dflashd --home H status works like dflashd status --home H."""
    result = subprocess.run(
        [sys.executable, "-m", "dflashd.supervisor", "--home", str(home), "status", "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 3 and json.loads(result.stdout)["home"] == str(home)


def test_tail_of_a_run_that_does_not_exist_names_the_runs(start_daemon: Start, home: Path) -> None:
    """tail --run 99: exit 2 naming the runs there are."""
    daemon = start_daemon(child("exit_silent.py"), restart={"early_retries": 1})
    daemon.wait()
    result = run_cli("tail", "--home", str(home), "--run", "99")
    assert result.returncode == 2
    assert "no run 99" in result.stderr and "runs there: 1-2" in result.stderr


def test_tail_grep_and_since(start_daemon: Start, home: Path) -> None:
    """--grep keeps matching records; --since in the future keeps none."""
    daemon = start_daemon(child("formats.py", "plain", "4", "exit0"))
    assert daemon.wait() == 0
    grep = run_cli("tail", "--home", str(home), "-n", "100", "--grep", "^Step [24]/")
    assert [line.split(" out ")[-1] for line in grep.stdout.splitlines()] == [
        "Step 2/4 loss 1.800",
        "Step 4/4 loss 1.600",
    ]
    future = run_cli("tail", "--home", str(home), "--since", "2999-01-01T00:00")
    assert future.returncode == 0 and future.stdout == ""
    bad = run_cli("tail", "--home", str(home), "--since", "last tuesday")
    assert bad.returncode == 2 and "--since" in bad.stderr


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("iter 100: loss 2.4049, time 929.71ms, mfu 16.59%", ("nanogpt", 100)),
        ("Epoch 0:   0%|          | 0/18 [00:00<?, ?it/s]", None),
        ("  0%|          | 0/500 [00:00<?, ?it/s]", None),
        ("[2022-03-11 02:06:58,985] [INFO] [timer.py:189:stop] 0/40, SamplesPerSec=83.4", None),
        ("global_step=10 micro_step=3", None),
        ("Loading 3 steps of warm-up", None),
        ("45it [00:05, 8.52it/s]", ("tqdm", 45)),
        (" 10%|█         | 50/500 [00:10<01:30,  5.00it/s]", ("tqdm", 50)),
        ("Training:  10%|█ | 5/50 [00:01<00:09,  5.00it/s, loss=2.1]", ("tqdm", 5)),
        ("Map: 100%|██████████| 1000/1000 [00:01<00:00, 800.00 examples/s]", None),
        ("Loading checkpoint shards:  50%|█████     | 1/2 [00:05<00:05,  5.00s/it]", None),
        ("Sanity Checking DataLoader 0: 100%|██████████| 2/2 [00:00<00:00, 10.0it/s]", None),
        ("Evaluating: 100%|██████████| 63/63 [00:02<00:00, 30.1it/s]", None),
        ("Resuming training from step 1000", None),
        ("checkpoint saved at step 500", None),
        ("2026-11-30 12:00:01 INFO Step 12/500 loss 2.31", ("plain", 12)),
        # a hand-made bar printed with no newline, the step line glued to it (a soak found a
        # job at 420 steps/s ended as no_progress after 900 s: no step was ever read)
        ("  41%|#####     | 41/1000000step 42 loss 2.020 lr 3e-4", ("plain", 42)),
        ("Substep 3 of the warm-up", None),
    ],
)
def test_format_edges(line: str, expected: tuple[str, int] | None) -> None:
    """Bars at 0, bars before training (data maps, checkpoint loading) and lookalikes are not
    steps; a training bar is, with or without a description."""
    found = match_line(line)
    assert (None if found is None else (found.format, found.step)) == expected
