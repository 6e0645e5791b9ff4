"""The bundled DFlash trainer on CPU: mask, learning, checkpoints, signals, faults under the daemon."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from dflashd.trainer.data import MarkovChain, SequencePool, make_batch  # noqa: E402
from dflashd.trainer.distributed import EX_PEER_STOPPED, Node, stop_outcome  # noqa: E402
from dflashd.trainer.mask import block_mask, dense_mask, dflash_mask_mod, reference_mask  # noqa: E402
from dflashd.trainer.model import Drafter, ModelConfig, TargetModel, dense_core, loss_and_accuracy  # noqa: E402
from dflashd.trainer.stopping import MIN_GRACE_S, grace_for  # noqa: E402
from tests.conftest import Daemon, run_cli  # noqa: E402

pytestmark = pytest.mark.trainer
Start = Callable[..., Daemon]
TRAINER = [sys.executable, "-m", "dflashd.trainer"]
SMALL = ["--workers", "2", "--batch", "2", "--ctx-len", "64", "--log-every", "1"]


def test_dense_mask_from_mask_mod_matches_reference() -> None:
    """The dense mask derived from the mask_mod equals an explicit loop over the DFlash rules."""
    anchors = torch.tensor([[1, 9, 30], [4, 5, 40]])
    ctx, bs = 48, 4
    mask_mod = dflash_mask_mod(anchors, ctx, bs)
    dense = dense_mask(mask_mod, 2, 3 * bs, ctx + 3 * bs, torch.device("cpu"))[:, 0]
    assert torch.equal(dense, reference_mask(anchors, ctx, bs))


def test_block_mask_agrees_with_dense_mask_at_block_granularity() -> None:
    """The flex BlockMask and the dense mask come from one function: same blocks present."""
    ctx, bs, blocks = 256, 16, 8
    anchors = torch.tensor([[1, 20, 60, 100, 130, 170, 200, 230]])
    mask_mod = dflash_mask_mod(anchors, ctx, bs)
    q_len, kv_len = blocks * bs, ctx + blocks * bs
    dense = dense_mask(mask_mod, 1, q_len, kv_len, torch.device("cpu"))[0, 0]
    bm = block_mask(mask_mod, 1, q_len, kv_len, torch.device("cpu"))
    as_blocks = bm.to_dense()[0, 0].bool()  # type: ignore[attr-defined]
    tile = 128
    expected = dense.view(q_len // tile, tile, kv_len // tile, tile).any(dim=3).any(dim=1)
    assert torch.equal(as_blocks, expected)


def test_training_steps_decrease_the_loss_on_a_fixed_batch() -> None:
    """A few optimizer steps on one batch lower its loss."""
    torch.manual_seed(0)
    cfg = ModelConfig(ctx_len=64)
    target, drafter = TargetModel(cfg), Drafter(cfg)
    target.requires_grad_(False)
    chain = MarkovChain.build(cfg.vocab, 0)
    pool = SequencePool.build(chain, seed=0, worker=0, size=16, length=72)
    batch = make_batch(
        pool,
        seed=0,
        step=0,
        worker=0,
        batch=4,
        ctx_len=64,
        blocks=4,
        block_size=8,
        mask_token=cfg.mask_token,
    )
    anchors = batch.anchors.clone()
    mask = dense_mask(dflash_mask_mod(anchors, 64, 8), 4, 32, 96, torch.device("cpu"))
    opt = torch.optim.AdamW(drafter.parameters(), lr=3e-3)
    losses = []
    for _ in range(5):
        logits = drafter(
            target.features(batch.context), batch.block_inputs, target, dense_core, mask
        )
        loss, _ = loss_and_accuracy(logits, batch.labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < losses[0] * 0.9


def step_losses(output: str) -> dict[int, str]:
    """{step: 'loss x.xxx'} from the trainer's step lines."""
    out = {}
    for line in output.splitlines():
        if line.startswith("step "):
            parts = line.split()
            out[int(parts[1].split("/")[0])] = parts[3]
    return out


def test_resume_gives_the_same_next_loss(tmp_path: Path) -> None:
    """Crash after a checkpoint, resume: steps after it have the losses of an uninterrupted run."""
    base = [*TRAINER, *SMALL, "--steps", "8", "--checkpoint-every", "5"]
    whole = subprocess.run(
        [*base, "--checkpoint-dir", str(tmp_path / "a")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert whole.returncode == 0, whole.stderr
    crashed = subprocess.run(
        [*base, "--checkpoint-dir", str(tmp_path / "b"), "--inject", "crash_at_step:6"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert crashed.returncode == 1 and "injected crash at step 6" in crashed.stderr
    resumed = subprocess.run(
        [*base, "--checkpoint-dir", str(tmp_path / "b")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from" in resumed.stdout and "at step 5" in resumed.stdout
    expected, got = step_losses(whole.stdout), step_losses(resumed.stdout)
    assert min(got) == 6
    assert {s: got[s] for s in (6, 7, 8)} == {s: expected[s] for s in (6, 7, 8)}


def test_sigterm_finishes_the_step_checkpoints_and_exits_0(tmp_path: Path) -> None:
    """SIGTERM mid-run: 'stopped at step N', exit 0, a checkpoint at step N."""
    proc = subprocess.Popen(
        [*TRAINER, *SMALL, "--steps", "100000", "--checkpoint-dir", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("step 3/"):
            break
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    stopped = [line for line in out.splitlines() if line.startswith("stopped at step")]
    assert stopped
    step = int(stopped[0].split()[3])
    state = torch.load(tmp_path / "latest.pt", weights_only=False)
    assert state["step"] == step >= 3


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_for_line(proc: subprocess.Popen[str], prefix: str) -> None:
    """Read the child's stdout until a line starts with ``prefix`` (EOF: the child died)."""
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith(prefix):
            return
    raise AssertionError(f"exited {proc.wait()} before a line starting {prefix!r}")


@contextmanager
def two_nodes(tmp_path: Path) -> Iterator[list[subprocess.Popen[str]]]:
    """Two trainer processes in one gloo group (torchrun's environment, without torchrun),
    both past their second step; whatever still runs at the end is killed."""
    port = free_port()
    ranks = []
    for rank in range(2):
        env = {
            **os.environ,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "WORLD_SIZE": "2",
            "RANK": str(rank),
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "1",
            "OMP_NUM_THREADS": "1",
        }
        cmd = [*TRAINER, *SMALL, "--workers", "1", "--steps", "100000", "--stop-grace-s", "60"]
        ranks.append(
            subprocess.Popen(
                [*cmd, "--checkpoint-dir", str(tmp_path)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    try:
        for proc in ranks:
            wait_for_line(proc, "step 2/")
        yield ranks
    finally:
        for proc in ranks:
            if proc.poll() is None:
                proc.kill()
                proc.send_signal(signal.SIGCONT)
            proc.communicate(timeout=30)


def test_a_stop_on_one_node_stops_every_node_after_the_same_step(tmp_path: Path) -> None:
    """SIGTERM to node 1 only: the request travels with the gradients, so both nodes stop
    after the same step and rank 0 checkpoints it; node 1 exits 0, node 0 exits 75 so that
    its torchrun restarts it and waits for node 1 to come back."""
    with two_nodes(tmp_path) as (node0, node1):
        node1.send_signal(signal.SIGTERM)
        out1, err1 = node1.communicate(timeout=60)
        out0, err0 = node0.communicate(timeout=60)
    assert (node0.returncode, node1.returncode) == (EX_PEER_STOPPED, 0), err0[-1500:] + err1[-1500:]
    stopped = [
        re.search(r"^stopped at step (\d+) \(checkpoint [^)]*\)(.*)$", out, re.M)
        for out in (out0, out1)
    ]
    assert stopped[0] is not None and stopped[1] is not None, (out0[-500:], out1[-500:])
    assert stopped[0].group(1) == stopped[1].group(1)
    assert "node rank 1 asked to stop; exit 75" in stopped[0].group(2)
    assert stopped[1].group(2) == ""
    state = torch.load(tmp_path / "latest.pt", weights_only=False)
    assert state["step"] == int(stopped[0].group(1))


def test_stop_outcome_exit_codes() -> None:
    """Alone or asked: 0.  Stopped only because another node was asked: 75, naming it."""
    node0 = Node(rank=0, world_size=3, local_rank=0, local_world_size=1, backend="gloo")
    assert stop_outcome([0], None, True) == (0, "")
    assert stop_outcome([0, 2], node0, True) == (0, "")
    code, why = stop_outcome([1, 2], node0, False)
    assert code == EX_PEER_STOPPED == 75 and "node rank 1, 2 asked to stop" in why


def test_sigterm_while_a_collective_waits_for_a_frozen_peer_exits_within_the_grace(
    tmp_path: Path,
) -> None:
    """Two nodes (gloo, no torchrun); node 1 frozen by SIGSTOP, so node 0's all-reduce waits
    (up to --dist-timeout-s, 120 s) where Python's handler never runs.  SIGTERM to node 0:
    it exits 143 a few step lengths later (not the 60 s cap), saying why, instead of hanging
    until a SIGKILL."""
    with two_nodes(tmp_path) as (node0, node1):
        node1.send_signal(signal.SIGSTOP)
        node0.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        _, err = node0.communicate(timeout=60)
        took = time.monotonic() - t0
    assert node0.returncode == 143, err[-2000:]
    said = re.search(r"stop: no step boundary within ([\d.]+)s of SIGTERM", err)
    assert said is not None, err[-2000:]
    grace = float(said.group(1))
    assert MIN_GRACE_S <= grace < 20 and grace - 0.5 < took < grace + 10, (grace, took)


def test_grace_is_a_few_recent_steps_within_its_floor_and_cap() -> None:
    """Before any step the whole cap (setup, compile); then 5x the slowest recent step."""
    assert grace_for([], 10.0) == 10.0
    assert grace_for([0.075, 0.08], 10.0) == MIN_GRACE_S  # H200 steps: the floor
    assert grace_for([0.5, 1.2, 0.6], 10.0) == pytest.approx(6.0)
    assert grace_for([0.5, 30.0], 10.0) == 10.0  # a checkpoint save among them: the cap


def test_a_second_stop_signal_exits_at_once_when_no_boundary_comes() -> None:
    """A main thread that never reaches a step boundary (here: asleep, in the real case a
    collective): the first SIGTERM sets the stop event; a second exits 143 at once instead
    of waiting out the grace (600 s here)."""
    child = (
        "import sys, threading, time\n"
        "from dflashd.trainer.stopping import Stop\n"
        "stop = Stop(grace_s=600)\n"
        "stop.step_took(0.1)\n"  # it trained a step: a stop waits for the next boundary
        "threading.Thread(target=lambda: (stop.event.wait(), print('event', flush=True)),"
        " daemon=True).start()\n"
        "print('ready', flush=True)\n"
        "while True:\n"
        "    time.sleep(3600)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", child], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_for_line(proc, "ready")
        proc.send_signal(signal.SIGTERM)
        wait_for_line(proc, "event")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 143
        assert "stop: a second SIGTERM: exiting now" in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_ctrl_c_before_the_first_step_exits_at_once_saying_what_it_was_doing(
    tmp_path: Path,
) -> None:
    """SIGINT while the trainer imports torch or sets up: exit 130 now (nothing is in flight,
    nothing new to save), and the message names the phase, not a hung collective."""
    listen = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listen.bind(str(tmp_path / "notify.sock"))
    listen.settimeout(60)
    env = {**os.environ, "NOTIFY_SOCKET": str(tmp_path / "notify.sock")}
    argv = [sys.executable, "-m", "dflashd.trainer", "--device", "cpu", "--steps", "50"]
    argv += ["--checkpoint-dir", str(tmp_path / "ckpt")]
    proc = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert listen.recv(4096) == b"STATUS=starting"  # sent once the stop handler is in
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        listen.close()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert re.search(r"stop: SIGINT while [a-z (),]+, before the first step: exiting now", err), err
    assert "collective" not in err and "Traceback" not in err
    assert not re.search(r"^step \d", out, re.M)


def test_a_stop_is_still_seen_if_something_replaces_the_wakeup_pipe() -> None:
    """Another library taking the wakeup fd must not make SIGTERM vanish: Python's own
    handler makes the request too (and is not counted as a second signal)."""
    child = (
        "import signal, sys\n"
        "from dflashd.trainer.stopping import Stop\n"
        "stop = Stop(grace_s=600)\n"
        "stop.step_took(0.1)\n"  # mid-training: the stop waits for the loop's boundary
        "signal.set_wakeup_fd(-1)\n"
        "print('ready', flush=True)\n"
        "sys.exit(0 if stop.event.wait(30) else 3)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", child], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    wait_for_line(proc, "ready")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err


def test_an_exit_that_hangs_after_the_outcome_is_decided_is_bounded() -> None:
    """Leaving a process group can hang on a peer that is gone: once the outcome (here a
    crash) is decided, the process exits with its code a grace later, traceback included."""
    child = (
        "import time\n"
        "from dflashd.trainer.stopping import Stop\n"
        "stop = Stop(grace_s=1)\n"
        "stop.bound_exit(1, ValueError('the step failed'), 'leaving')\n"
        "while True:\n"
        "    time.sleep(3600)\n"
    )
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "ValueError: the step failed" in done.stderr
    assert "exit: leaving took over 1s: exiting 1 now" in done.stderr


@pytest.mark.parametrize(
    ("inject", "verdict", "reason"),
    [
        ("import_error", "crash_before_first_step", "import_error"),
        ("crash_before_first_step", "crash_before_first_step", "RuntimeError"),
        ("oom", "crash_before_first_step", "cuda_oom"),
        ("crash_at_step:3", "crashed", "RuntimeError"),
    ],
)
def test_fault_injection_gives_the_intended_verdict(
    start_daemon: Start, tmp_path: Path, inject: str, verdict: str, reason: str
) -> None:
    """Each injected fault ends with the verdict dflashd is meant to give, under the real daemon."""
    cmd = [
        *TRAINER,
        *SMALL,
        "--steps",
        "50",
        "--checkpoint-dir",
        str(tmp_path / "ck"),
        "--inject",
        inject,
    ]
    daemon = start_daemon(cmd, restart={"early_retries": 0, "runtime_retries": 0})
    assert daemon.wait(180) == 4
    exit_rec = daemon.events("exit")[0]
    assert (exit_rec.fields["verdict"], exit_rec.fields["reason"]) == (verdict, reason)


def test_hang_before_cuda_is_stalled_without_gpu(start_daemon: Start, tmp_path: Path) -> None:
    """Hanging before CUDA on a GPU-less box: no first step in time -> stalled, with the stack in the log."""
    cmd = [*TRAINER, "--checkpoint-dir", str(tmp_path / "ck"), "--inject", "hang_before_cuda"]
    daemon = start_daemon(cmd, first_step_timeout_s=3.0, restart={"early_retries": 0})
    assert daemon.wait(60) == 4
    exit_rec = daemon.events("exit")[0]
    assert (exit_rec.fields["verdict"], exit_rec.fields["reason"]) == (
        "stalled",
        "first_step_timeout",
    )


def test_per_thread_backends_and_dense_fallback_is_exit_78(
    start_daemon: Start, tmp_path: Path
) -> None:
    """With compile on, each worker reports its own backend by evidence; an unexpected dense path
    under --require-flex is exit 78, which dflashd makes fatal at once (no retry)."""
    cmd = [
        *TRAINER,
        *SMALL,
        "--compile",
        "--require-flex",
        "--inject",
        "dense_fallback",
        "--checkpoint-dir",
        str(tmp_path / "ck"),
    ]
    env_cache = {"TORCHINDUCTOR_COMPILE_THREADS": "1"}
    daemon = start_daemon(cmd, env=env_cache, restart={"early_retries": 3})
    assert daemon.wait(300) == 4
    lines = [r.line for r in daemon.records() if hasattr(r, "line")]
    assert any(
        "compile_done worker=0 attention_backend=dense_eager expected=dense_compiled" in line
        for line in lines
    )
    assert any(
        "compile_done worker=1 attention_backend=dense_compiled expected=dense_compiled" in line
        for line in lines
    )
    assert any(line.startswith("dense_fallback: worker 0") for line in lines)
    assert len(daemon.events("exit")) == 1
    assert daemon.events("fatal")[0].fields["reason"] == "no_restart_exit_code_78"
    statuses = [e.fields["status"] for e in daemon.events("child_status")]
    assert any(s.startswith("dense fallback") for s in statuses)


def test_default_job_reaches_first_step_under_dflashd(start_daemon: Start, home: Path) -> None:
    """`dflashd start` with no command runs the bundled trainer: READY arrives, steps advance."""
    daemon = start_daemon(None, restart={"early_retries": 0})
    first = daemon.wait_event("first_step", timeout=60)
    assert first.fields["source"] == "notify" and first.fields["after_s"] < 30
    daemon.wait_for(lambda r: getattr(r, "line", "").startswith("step 20/"), timeout=60)
    assert os.path.exists(home / "state.json")
    # its loss reaches status and the progress records (the report's loss chart)
    daemon.wait_for(lambda r: getattr(r, "event", "") == "progress" and "loss" in r.fields, 60)
    status = json.loads(run_cli("status", "--json", "--home", str(home)).stdout)
    assert isinstance(status["loss"], float)
