"""The daemon end to end: real children that really crash, through the real CLI."""

from __future__ import annotations

import json
import os
import signal
import stat
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from dflashd.logs import EventRecord, LineRecord
from dflashd.logs.linecodec import CODEC
from dflashd.logs.records import parse_timestamp
from tests.conftest import Daemon, child, run_cli, write_config

Start = Callable[..., Daemon]


def line_records(daemon: Daemon, src: str | None = None) -> list[LineRecord]:
    """The child's lines in the log."""
    return [
        r for r in daemon.records() if isinstance(r, LineRecord) and (src is None or r.src == src)
    ]


def test_silent_death_is_a_fact_in_the_log(start_daemon: Start, home: Path) -> None:
    """exit 3 with no output: the log exists, spawn before exit, verdict silent_death, then fatal."""
    daemon = start_daemon(child("exit_silent.py"))
    assert daemon.wait() == 4
    events = [r.event for r in daemon.records() if isinstance(r, EventRecord)]
    assert events.index("spawn") < events.index("launched") < events.index("exit")
    exit_rec = daemon.events("exit")[0]
    assert exit_rec.fields["verdict"] == "silent_death"
    assert exit_rec.fields["exit_code"] == 3
    assert exit_rec.fields["note"] == "exited before writing anything"
    assert daemon.events("fatal")[0].fields["reason"] == "early_retries_exhausted"
    status = run_cli("status", "--home", str(home), "--json")
    assert status.returncode == 3
    assert json.loads(status.stdout)["state"] == "fatal"


def test_import_error_traceback_reaches_tail_and_status(start_daemon: Start, home: Path) -> None:
    """An import error is crash_before_first_step/import_error with the traceback in the exit record."""
    daemon = start_daemon(child("import_error.py"))
    assert daemon.wait() == 4
    exit_rec = daemon.events("exit")[0]
    assert exit_rec.fields["verdict"] == "crash_before_first_step"
    assert exit_rec.fields["reason"] == "import_error"
    assert any("ModuleNotFoundError" in line for line in exit_rec.fields["tail"])
    status = json.loads(run_cli("status", "--home", str(home), "--json").stdout)
    assert any("ModuleNotFoundError" in line for line in status["last_exit"]["tail"])
    assert status["log_codec"] == CODEC.implementation  # the loops the daemon ran
    tail = run_cli("tail", "--home", str(home), "-n", "50", "--src", "stderr")
    assert "No module named 'dflashd_module_that_does_not_exist'" in tail.stdout


def test_nonexistent_binary_is_spawn_failed_on_the_terminal(home: Path, tmp_path: Path) -> None:
    """A command that cannot exec: start exits 4 (fatal) naming the OS error; the log says spawn_failed."""
    config = write_config(tmp_path / "c.toml", {"gpus": "none"})
    result = run_cli(
        "start", "--home", str(home), "--config", str(config), "--", "/nonexistent/trainer", "--x"
    )
    assert result.returncode == 4
    assert "spawn failed" in result.stderr and "No such file or directory" in result.stderr
    records = [
        r
        for r in __import__("dflashd.logs").logs.read_records(home / "logs")
        if isinstance(r, EventRecord)
    ]
    exit_rec = next(r for r in records if r.event == "exit")
    assert exit_rec.fields["verdict"] == "spawn_failed"
    assert any(r.event == "fatal" for r in records)


def test_segfault_after_partial_line_keeps_the_partial_line(start_daemon: Start) -> None:
    """SIGSEGV after an unterminated write: the partial line is logged, the signal named."""
    daemon = start_daemon(child("segv_partial.py"))
    daemon.wait()
    partial = [r for r in line_records(daemon, "stdout") if r.partial]
    assert [r.line for r in partial] == ["half a line before the crash"]
    exit_rec = daemon.events("exit")[0]
    assert exit_rec.fields["signal"] == "SIGSEGV"
    assert exit_rec.fields["reason"].startswith("SIGSEGV")
    assert any("Fatal Python error: Segmentation fault" in line for line in exit_rec.fields["tail"])
    assert exit_rec.seq > partial[0].seq  # the child's last words come before the exit record


def test_grandchild_holding_the_pipe_does_not_hide_the_death(
    start_daemon: Start, home: Path, tmp_path: Path
) -> None:
    """The death is seen at once although a grandchild holds stdout; its later output is still logged; stop kills it."""
    marker = tmp_path / "died_at"
    daemon = start_daemon(
        child("grandchild_holds_pipe.py", str(marker)),
        restart={"early_retries": 5, "backoff_initial_s": 60.0, "backoff_max_s": 60.0},
    )
    exit_rec = daemon.wait_event("exit")
    latency = parse_timestamp(exit_rec.ts) - float(marker.read_text())
    assert latency < 0.5, f"death seen after {latency:.3f}s"
    late = daemon.wait_for(lambda r: isinstance(r, LineRecord) and r.line == "grandchild late line")
    assert late.run == 1
    leftovers = daemon.wait_event("leftover_processes")
    grandchild_pids = leftovers.fields["pids"]
    assert grandchild_pids and all(psutil.pid_exists(p) for p in grandchild_pids)
    stop = run_cli("stop", "--home", str(home), "--timeout", "2")
    assert stop.returncode == 0, stop.stderr
    assert daemon.wait() == 0
    for pid in grandchild_pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


@pytest.mark.parametrize("how", ["notify", "pattern"])
def test_crash_after_first_step_is_crashed_not_early(start_daemon: Start, how: str) -> None:
    """First step by notify or by pattern, then exit 5: verdict crashed, restart without clearing caches."""
    extra = (
        {"first_step_pattern": r"^step 1/", "step_pattern": r"^step (\d+)/"}
        if how == "pattern"
        else {}
    )
    daemon = start_daemon(
        child("progress_then.py", how, "crash"), restart={"runtime_retries": 1}, **extra
    )
    assert daemon.wait() == 4
    exits = daemon.events("exit")
    assert [e.fields["verdict"] for e in exits] == ["crashed", "crashed"]
    assert exits[0].fields["step"] == 3
    assert daemon.events("first_step")[0].fields["source"] == how
    restart = daemon.events("restart")[0]
    assert restart.fields["cache_cleared"] is False
    assert daemon.events("fatal")[0].fields["reason"] == "runtime_retries_exhausted"


def test_exit_zero_after_first_step_completes(start_daemon: Start, home: Path) -> None:
    """exit 0 after progress: completed, no restart, the daemon exits 0."""
    daemon = start_daemon(child("progress_then.py", "notify", "exit0"))
    assert daemon.wait() == 0
    assert [e.fields["verdict"] for e in daemon.events("exit")] == ["completed"]
    assert daemon.events("restart") == []
    status = json.loads(run_cli("status", "--home", str(home), "--json").stdout)
    assert status["state"] == "completed" and status["last_exit"]["verdict"] == "completed"


def test_crash_loop_ends_fatal_with_one_alert_per_kind(start_daemon: Start, tmp_path: Path) -> None:
    """Four early deaths (a retryable error) with a budget of 3: fatal; alerts for the first death and the fatal only."""
    alerts_file = tmp_path / "alerts.jsonl"
    sink = tmp_path / "alert_sink.sh"
    sink.write_text(f"#!/bin/sh\ncat >> {alerts_file}\necho >> {alerts_file}\n")
    sink.chmod(sink.stat().st_mode | stat.S_IXUSR)
    daemon = start_daemon(
        child("crash_early.py"),
        restart={"early_retries": 3},
        alerts={"command": [str(sink)]},
    )
    assert daemon.wait() == 4
    assert len(daemon.events("exit")) == 4
    # The daemon lets queued alerts finish before it exits, so the records are all there now.
    sent = [json.loads(line) for line in alerts_file.read_text().splitlines() if line.strip()]
    assert [a["verdict"] for a in sent] == ["crash_before_first_step", "fatal"]
    assert sent[0]["reason"] == "RuntimeError" and sent[0]["run"] == 1
    assert any("NCCL timeout" in line for line in sent[0]["tail"])
    assert sent[1]["reason"] == "early_retries_exhausted"
    assert {
        "verdict",
        "reason",
        "run",
        "exit_code",
        "signal",
        "duration_s",
        "tail",
        "gpus",
        "log",
        "host",
        "time",
        "node",
        "home",
        "command",
    } <= sent[0].keys()
    assert all(a.fields["ok"] for a in daemon.events("alert"))
    # who, where, when: a person paged at night, a dashboard joining many homes (issue 44)
    assert sent[0]["home"] == str(daemon.home) and sent[0]["command"][-1].endswith("crash_early.py")
    assert sent[0]["time"].endswith("+00:00") and sent[0]["node"]


def test_stall_dumps_stacks_then_kills(start_daemon: Start) -> None:
    """A pattern says what a step is, none came within first_step_timeout_s: SIGABRT dumps the stack, stalled."""
    daemon = start_daemon(
        child("hang.py"),
        first_step_pattern="^step ",
        first_step_timeout_s=1.0,
        restart={"early_retries": 0},
    )
    assert daemon.wait() == 4
    exit_rec = daemon.events("exit")[0]
    assert (
        exit_rec.fields["verdict"] == "stalled"
        and exit_rec.fields["reason"] == "first_step_timeout"
    )
    assert "wait_for_a_collective_that_never_comes" in daemon.stacks_text()
    assert daemon.events("ending_run")[0].fields["dump"] == "py-spy"
    assert exit_rec.fields["stacks"]["path"]


def test_without_py_spy_faulthandler_dumps_the_stack(
    start_daemon: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fallback: SIGABRT, faulthandler prints every thread into stderr, then the kill."""
    monkeypatch.setenv("DFLASHD_STACKS", "faulthandler")
    daemon = start_daemon(
        child("hang.py"),
        first_step_pattern="^step ",
        first_step_timeout_s=1.0,
        restart={"early_retries": 0},
    )
    assert daemon.wait() == 4
    ending = daemon.events("ending_run")[0].fields
    assert ending["dump"] == "faulthandler" and "DFLASHD_STACKS" in ending["py_spy"]
    stderr = "\n".join(r.line for r in line_records(daemon, "stderr"))
    assert "wait_for_a_collective_that_never_comes" in stderr


def test_silent_job_with_no_visible_steps_ends_only_after_stall_timeout(
    start_daemon: Start,
) -> None:
    """No way to see steps: the first-step timeout never applies; total silence for stall_timeout_s does."""
    daemon = start_daemon(
        child("hang.py"),
        first_step_timeout_s=0.2,
        stall_timeout_s=1.5,
        restart={"early_retries": 0},
    )
    assert daemon.wait() == 4
    exit_rec = daemon.events("exit")[0]
    assert (exit_rec.fields["verdict"], exit_rec.fields["reason"]) == ("stalled", "no_progress")
    assert exit_rec.fields["duration_s"] >= 1.5  # not ended at the 0.2 s first-step timeout


def test_no_progress_after_first_step_is_stalled(start_daemon: Start) -> None:
    """Steps, then silence past stall_timeout_s: stalled (no_progress)."""
    daemon = start_daemon(
        child("progress_then.py", "notify", "hang"),
        stall_timeout_s=1.0,
        restart={"runtime_retries": 0},
    )
    assert daemon.wait() == 4
    exit_rec = daemon.events("exit")[0]
    assert (exit_rec.fields["verdict"], exit_rec.fields["reason"]) == ("stalled", "no_progress")


def test_child_output_imitating_a_record_stays_a_child_line(start_daemon: Start) -> None:
    """A child printing a dflashd-looking exit record produces a stdout line, not an event."""
    daemon = start_daemon(child("imitate_record.py"))
    daemon.wait()
    lines = line_records(daemon, "stdout")
    assert len(lines) == 1 and '"src":"dflashd"' in lines[0].line
    assert [e.fields["verdict"] for e in daemon.events("exit")] == ["completed"]


def test_200k_lines_from_both_streams_without_gaps(start_daemon: Start) -> None:
    """200k lines over stdout and stderr: all present, seq contiguous from the first record."""
    daemon = start_daemon(child("flood.py", "200000"))
    assert daemon.wait(120) == 0
    records = daemon.records()
    seqs = [r.seq for r in records]
    assert seqs == list(range(1, len(records) + 1))
    lines = line_records(daemon)
    assert len(lines) == 200_000
    for src, parity in (("stdout", 0), ("stderr", 1)):
        numbers = [int(r.line.split()[-1]) for r in lines if r.src == src]
        assert numbers == list(range(parity, 200_000, 2))


def test_stop_escalates_to_sigkill(start_daemon: Start, home: Path) -> None:
    """A child that ignores SIGTERM is SIGKILLed after --timeout; verdict stopped."""
    daemon = start_daemon(child("ignore_term.py"))
    daemon.wait_event("first_step")
    began = time.monotonic()
    result = run_cli("stop", "--home", str(home), "--timeout", "0.5")
    assert result.returncode == 0 and "stopped" in result.stdout
    assert time.monotonic() - began < 10
    assert daemon.wait() == 0
    exit_rec = daemon.events("exit")[0]
    assert (exit_rec.fields["verdict"], exit_rec.fields["signal"]) == ("stopped", "SIGKILL")
    assert daemon.events("stop_timeout")


def test_sigkill_of_the_daemon_leaves_no_child(
    start_daemon: Start, home: Path, tmp_path: Path
) -> None:
    """Daemon SIGKILLed: the child dies with it (PDEATHSIG); the next daemon ends the leftover grandchild."""
    pids_file = tmp_path / "pids"
    daemon = start_daemon(
        child("sleeper_with_grandchild.py", str(pids_file)), restart={"early_retries": 3}
    )
    daemon.wait_event("first_step")
    status = json.loads(run_cli("status", "--home", str(home), "--json").stdout)
    child_pid = status["child_pid"]
    grandchild_pid = int(pids_file.read_text())
    os.kill(daemon.proc.pid, signal.SIGKILL)
    daemon.wait()
    psutil.wait_procs([psutil.Process(child_pid)], timeout=10)
    assert (
        not psutil.pid_exists(child_pid)
        or psutil.Process(child_pid).status() == psutil.STATUS_ZOMBIE
    )
    second = start_daemon(child("exit_silent.py"))
    recovered = second.wait_event("recovered_orphan")
    assert grandchild_pid in recovered.fields["pids"]
    second.wait()
    _gone, _ = (
        psutil.wait_procs([psutil.Process(grandchild_pid)], timeout=10)
        if psutil.pid_exists(grandchild_pid)
        else ([], [])
    )
    assert (
        not psutil.pid_exists(grandchild_pid)
        or psutil.Process(grandchild_pid).status() == psutil.STATUS_ZOMBIE
    )
    runs = [r.run for r in second.events("spawn")]
    assert runs == [1, 2]  # the run counter continues across daemons
    seqs = [r.seq for r in second.records()]
    assert seqs == list(range(1, len(seqs) + 1))  # one log, continued, nothing truncated


def test_bad_config_exits_2_and_launches_nothing(home: Path, tmp_path: Path) -> None:
    """An unknown key: exit 2, the key named in one line, no log, no daemon."""
    config = tmp_path / "bad.toml"
    config.write_text('comand = ["python"]\n')
    result = run_cli("start", "--home", str(home), "--config", str(config))
    assert result.returncode == 2
    assert result.stderr.strip() == "dflashd: config error: unknown config key 'comand'"
    assert not (home / "logs").exists()


def test_double_start_exits_1_naming_the_pid(
    start_daemon: Start, home: Path, tmp_path: Path
) -> None:
    """A second start on the same home refuses with the running daemon's pid."""
    daemon = start_daemon(child("ignore_term.py"))
    daemon.wait_event("first_step")
    config = write_config(tmp_path / "c2.toml", {"gpus": "none"})
    result = run_cli("start", "--home", str(home), "--config", str(config), "--", "true")
    assert result.returncode == 1
    assert f"already running (pid {daemon.proc.pid})" in result.stderr


def test_control_socket_and_home_are_owner_only(start_daemon: Start, home: Path) -> None:
    """The control socket is 0600 and the home 0700."""
    daemon = start_daemon(child("ignore_term.py"))
    daemon.wait_event("first_step")
    assert stat.S_IMODE((home / "control.sock").stat().st_mode) == 0o600
    assert stat.S_IMODE(home.stat().st_mode) == 0o700


def test_detached_start_returns_after_launch_and_status_works(home: Path, tmp_path: Path) -> None:
    """`dflashd start` (detached) prints run and log, `status` exits 0, `stop` ends it."""
    config = write_config(tmp_path / "c.toml", {"gpus": "none"})
    result = run_cli(
        "start", "--home", str(home), "--config", str(config), "--", *child("ignore_term.py")
    )
    assert result.returncode == 0, result.stderr
    assert (
        "run 1 launched" in result.stdout and str(home / "logs" / "dflashd.jsonl") in result.stdout
    )
    status = run_cli("status", "--home", str(home))
    assert status.returncode == 0 and "running" in status.stdout
    stop = run_cli("stop", "--home", str(home), "--timeout", "0.5")
    assert stop.returncode == 0
    assert run_cli("status", "--home", str(home)).returncode == 3


def test_a_compile_worker_left_behind_is_killed_at_once_not_after_the_grace(
    start_daemon: Start, tmp_path: Path
) -> None:
    """Inductor's compile workers hold no state: SIGKILL at once, so the relaunch does not wait
    the 3 s SIGTERM grace (this one ignores SIGTERM, so the grace would run out in full)."""
    pids = tmp_path / "worker.pid"
    daemon = start_daemon(
        child("compile_worker_leftover.py", str(tmp_path / "site"), str(pids)),
        restart={"runtime_retries": 1, "backoff_initial_s": 0.0},
    )
    assert daemon.wait() == 4
    first_worker = int((tmp_path / "worker.pid.1").read_text())
    ending = next(r for r in daemon.events("ending_leftovers") if r.run == 1)
    assert ending.fields["sigkill_at_once"] == [first_worker]
    assert str(first_worker) in ending.fields["pids"]
    exited = next(r for r in daemon.events("exit") if r.run == 1)
    relaunched = next(r for r in daemon.events("launched") if r.run == 2)
    waited = parse_timestamp(relaunched.ts) - parse_timestamp(exited.ts)
    assert waited < 2.0, f"relaunch {waited:.2f} s after the death"
    assert not psutil.pid_exists(first_worker) or (
        psutil.Process(first_worker).status() == psutil.STATUS_ZOMBIE
    )
