"""Live stacks: the odd rank out as a table, ``dflashd stacks`` on a live job, and a frozen rank
of a real torchrun gloo group dumped before dflashd kills the stalled job."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from dflashd.supervisor.host.procfs import read_stat
from dflashd.supervisor.host.pyspy import find_py_spy
from dflashd.supervisor.model.stacks import (
    ProcessStacks,
    Role,
    StackFrame,
    StacksDump,
    ThreadStack,
    alert_lines,
    odd_ranks,
    parse_pyspy,
    summary,
)
from tests.conftest import Daemon, child, run_cli

needs_py_spy = pytest.mark.skipif(find_py_spy() is None, reason="py-spy is not installed")

ALL_REDUCE = StackFrame("all_reduce", "torch/distributed/distributed_c10d.py", 2501)
BACKWARD = StackFrame("backward", "torch/autograd/graph.py", 744)
FORWARD = StackFrame("forward", "model.py", 40)
OWN_GLOO_FILE = StackFrame("frozen_here", "gloo_ranks.py", 20)  # a user's file named like a backend


def rank(r: int, *frames: StackFrame) -> ProcessStacks:
    thread = ThreadStack(1000 + r, "MainThread", True, False, frames)
    return ProcessStacks(1000 + r, Role("worker", r, r), (thread,))


@pytest.mark.parametrize(
    ("ranks", "odd"),
    [
        ([rank(0, ALL_REDUCE), rank(1, FORWARD)], [1]),  # two ranks: the one outside the collective
        ([rank(0, FORWARD), rank(1, ALL_REDUCE)], [0]),
        ([rank(0, ALL_REDUCE), rank(1, ALL_REDUCE)], []),  # all agree
        ([rank(0, BACKWARD), rank(1, BACKWARD), rank(2, ALL_REDUCE), rank(3, BACKWARD)], [2]),
        ([rank(0, ALL_REDUCE), rank(1, ALL_REDUCE), rank(2, FORWARD), rank(3, ALL_REDUCE)], [2]),
        ([rank(0, FORWARD), rank(1, BACKWARD)], []),  # two ranks, neither waits: no answer
        ([rank(0, ALL_REDUCE)], []),
        ([rank(0, ALL_REDUCE), rank(1, OWN_GLOO_FILE)], [1]),
        ([rank(0, StackFrame("ncclGroupEnd", "libnccl.so.2", 0)), rank(1, BACKWARD)], [1]),
    ],
)
def test_the_odd_rank_out(ranks: list[ProcessStacks], odd: list[int]) -> None:
    assert [p.role.rank for p in odd_ranks(ranks)] == odd


def test_py_spy_json_becomes_a_labelled_dump() -> None:
    data = [
        {
            "os_thread_id": 7,
            "thread_name": None,
            "active": True,
            "owns_gil": True,
            "frames": [
                {"name": "all_reduce", "short_filename": "torch/distributed/c10d.py", "line": 9},
                {"name": "cudaStreamSynchronize", "short_filename": "libcudart.so", "line": 0},
            ],
        },
        {"os_thread_id": 8, "thread_name": "loader", "frames": [], "active": False},
        "not a thread",
    ]
    parsed = parse_pyspy(7, Role("worker", 3, 1), data, 0.02)
    assert [t.name for t in parsed.threads] == ["MainThread", "loader"]
    assert parsed.top() == [
        "all_reduce (torch/distributed/c10d.py:9)",
        "cudaStreamSynchronize (libcudart.so)",
    ]
    fields = summary(StacksDump(2, "command", "py-spy", [parsed]))
    assert fields["processes"][0]["role"] == "worker rank 3 (local 1)"
    assert fields["odd_rank_out"] is None
    assert "active_threads" not in fields["processes"][0]  # the only active one is main


def test_an_active_worker_thread_reaches_the_alert() -> None:
    """A threaded trainer hangs in a worker thread, not in main: the alert shows that thread."""
    sync = StackFrame("cudaDeviceSynchronize", "libcudart.so.13", 0)
    hang = StackFrame("Worker._hang_here", "trainer/workers.py", 271)
    main = ThreadStack(10, "MainThread", False, False, (StackFrame("Worker.result", "w.py", 287),))
    worker = ThreadStack(
        11, "worker-0", True, False, (StackFrame("0x7f00", "libcuda.so", 0), sync, hang)
    )
    idle = ThreadStack(12, "loader", False, False, (FORWARD,))
    dump = StacksDump(
        1, "no_progress", "py-spy --native", [ProcessStacks(10, Role("root"), (main, worker, idle))]
    )
    lines = alert_lines(summary(dump))
    assert lines[0] == "root pid 10: Worker.result (w.py:287)"
    assert lines[1] == (
        "  thread worker-0: cudaDeviceSynchronize (libcudart.so.13) <- "
        "Worker._hang_here (trainer/workers.py:271)"
    )
    # every waiting thread too (issue 54: the root thread alone said little), capped
    assert lines[2] == "  thread loader (waiting): forward (model.py:40)" and len(lines) == 3
    many = tuple(ThreadStack(100 + i, f"w{i}", False, False, (FORWARD,)) for i in range(20))
    crowd = StacksDump(1, "hung", "py-spy", [ProcessStacks(10, Role("root"), (main, *many))])
    waiting = [line for line in alert_lines(summary(crowd)) if "(waiting)" in line]
    assert len(waiting) == 8


def _run_states(home: Path) -> dict[int, str]:
    status = json.loads(run_cli("status", "--home", str(home), "--json").stdout)
    pid = status["child_pid"]
    found = read_stat(pid)
    return {pid: found.state if found is not None else "?"}


@needs_py_spy
@pytest.mark.parametrize("native", [False, True])
def test_stacks_of_a_live_job_leave_it_running(start_daemon: Any, home: Path, native: bool) -> None:
    """`dflashd stacks` shows every thread by name; the job's step keeps advancing and no
    process is left stopped (state T), in the default non-blocking mode and with --native."""
    daemon: Daemon = start_daemon(child("named_threads.py"))
    daemon.wait_event("first_step")
    args = ["stacks", "--home", str(home), *(["--native"] if native else [])]
    done = run_cli(*args)
    assert done.returncode == 0, done.stderr
    for name in ('"MainThread"', '"grad-worker-0"', '"data-loader"', "named_threads.py"):
        assert name in done.stdout
    if native:
        assert "libc" in done.stdout or "libpython" in done.stdout  # C frames
    record = daemon.events("stacks")[-1]
    assert record.fields["trigger"] == "command" and Path(record.fields["path"]).is_file()
    assert all(state not in ("T", "t") for state in _run_states(home).values())
    step_then = json.loads(run_cli("status", "--home", str(home), "--json").stdout)["step"]
    daemon.wait_for(
        lambda r: getattr(r, "line", "").startswith(f"step {step_then + 3} "), timeout=10
    )
    as_json = json.loads(run_cli("stacks", "--home", str(home), "--json").stdout)
    names = {t["name"] for p in as_json["dump"]["processes"] for t in p["threads"]}
    assert {"MainThread", "grad-worker-0", "data-loader"} <= names


@needs_py_spy
def test_a_frozen_rank_is_named_before_the_stalled_job_is_killed(
    start_daemon: Any, home: Path
) -> None:
    """Two gloo ranks under torchrun; rank 1 freezes in its own code, rank 0 waits in
    all_reduce.  dflashd stalls the job as always, but first dumps both ranks: rank 1 is the
    odd rank out, rank 0's frames show the collective; the exit record points at the dump."""
    pytest.importorskip("torch")
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        str(Path(__file__).parent / "children" / "gloo_ranks.py"),
        "1",
    ]
    daemon: Daemon = start_daemon(command, stall_timeout_s=4.0, first_step_timeout_s=300.0)
    started = time.monotonic()
    exit_record = daemon.wait_event("exit", timeout=120)
    records = daemon.records()
    names = [getattr(r, "event", None) for r in records]
    stacks = daemon.events("stacks")[0]
    assert names.index("stacks") < names.index("exit")  # dumped before the kill
    assert stacks.fields["trigger"] == "no_progress"
    ranks = {p["rank"]: p for p in stacks.fields["processes"] if p["rank"] is not None}
    assert set(ranks) == {0, 1}
    assert stacks.fields["odd_rank_out"] == [1]
    assert "frozen_here" in " ".join(ranks[1]["top"])
    assert "all_reduce" in " ".join(ranks[0]["top"])
    assert exit_record.fields["verdict"] == "stalled"
    assert exit_record.fields["stacks"]["path"] == stacks.fields["path"]
    ending = daemon.events("ending_run")[0]
    assert ending.fields["dump"] == "py-spy"
    text = Path(stacks.fields["path"]).read_text()
    assert "odd rank out: rank 1" in text and "worker rank 0" in text
    assert time.monotonic() - started < 120


def test_the_report_marks_each_dump_with_a_link() -> None:
    from dflashd.logs import EventRecord
    from dflashd.supervisor.client.htmlreport import render_html
    from dflashd.supervisor.client.reportdata import collect

    records = [
        EventRecord("2026-12-01T10:00:00.000000Z", 1, 1, "spawn", {}),
        EventRecord(
            "2026-12-01T10:05:00.000000Z",
            2,
            1,
            "stacks",
            {"trigger": "no_progress", "path": "/h/s.txt"},
        ),
        EventRecord(
            "2026-12-01T10:05:01.000000Z", 3, 1, "exit", {"verdict": "stalled", "reason": "x"}
        ),
    ]
    page = render_html(collect(records), "report")
    assert "<circle" in page and "file:///h/s.txt" in page and "stack dump (no_progress)" in page


@needs_py_spy
def test_a_frozen_rank_of_the_bundled_trainer_is_named(start_daemon: Any, home: Path) -> None:
    """The bundled trainer, two ranks in one gloo group under torchrun; rank 1's worker thread
    hangs at step 5 (its main thread waits for it), rank 0 waits in the gradient all-reduce.
    The dump before the stall's kill names rank 1."""
    pytest.importorskip("torch")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    command += ["-m", "dflashd.trainer", "--steps", "200", "--log-every", "1"]
    command += ["--checkpoint-dir", str(home.parent / "ck"), "--inject", "hang_at_step:5:0:1"]
    daemon: Daemon = start_daemon(command, stall_timeout_s=8.0, first_step_timeout_s=300.0)
    exit_record = daemon.wait_event("exit", timeout=180)
    stacks = daemon.events("stacks")[0]
    ranks = {p["rank"]: p for p in stacks.fields["processes"] if p["rank"] is not None}
    assert set(ranks) == {0, 1}
    assert stacks.fields["odd_rank_out"] == [1]
    assert any("all_reduce" in frame for frame in ranks[0]["top"])
    assert exit_record.fields["verdict"] == "stalled"
    assert "Worker._hang_here" in Path(stacks.fields["path"]).read_text()
