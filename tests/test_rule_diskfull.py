"""The ``disk_full`` rule (model/diskfull.py): its evidence as a table, its history through
``step`` (one alert, no relaunch while the disk is full, the relaunch when room returns), and
a real full tmpfs where this machine lets the test mount one."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dflashd.logs import EventRecord
from dflashd.supervisor.host.config import ConfigError, parse_config
from dflashd.supervisor.model.deadlines import Deadline
from dflashd.supervisor.model.effects import (
    Launch,
    LookForRelease,
    SendAlert,
    WriteRecord,
)
from dflashd.supervisor.model.events import Event
from dflashd.supervisor.model.goodput import GoodputLedger, RunTimes
from dflashd.supervisor.model.inputs import ChildExited, DeadlineDue, ReleaseLooked, Started
from dflashd.supervisor.model.ledger import Ledger
from dflashd.supervisor.model.policy import RestartConfig
from dflashd.supervisor.model.rules import ALERTED_BY_DEFAULT
from dflashd.supervisor.model.runstate import RunFacts
from dflashd.supervisor.model.step import HOLD_LOOK_S, DaemonState, Rules, step
from dflashd.supervisor.model.verdicts import EndedBy, Observations
from tests.conftest import Daemon, run_cli
from tests.helpers import tmpfs
from tests.tables import launch_heard

SAVE = (
    "Traceback (most recent call last):",
    '  File "/work/train.py", line 88, in <module>',
    "    torch.save(state, path)",
    "OSError: [Errno 28] No space left on device: '/ckpt/step_100.pt'",
)
QUOTA = (
    "Traceback (most recent call last):",
    '  File "/work/train.py", line 88, in <module>',
    "OSError: [Errno 122] Disk quota exceeded: '/home/me/ckpt/step_100.pt'",
)
SURVIVED = (
    "warning: could not write the cache: [Errno 28] No space left on device",
    "Traceback (most recent call last):",
    '  File "/work/train.py", line 12, in <module>',
    "RuntimeError: CUDA error: an illegal memory access was encountered",
)


@pytest.mark.parametrize(
    ("obs", "verdict", "reason", "held"),
    [
        (
            Observations(exit_code=1, reached_first_step=True, output_lines=9, stderr_tail=SAVE),
            "disk_full",
            "ENOSPC:/ckpt/step_100.pt",
            "room on /ckpt/step_100.pt",
        ),
        (
            Observations(exit_code=1, output_lines=3, stderr_tail=SAVE),  # before its first step
            "disk_full",
            "ENOSPC:/ckpt/step_100.pt",
            "room on /ckpt/step_100.pt",
        ),
        (
            Observations(exit_code=1, reached_first_step=True, output_lines=9, stderr_tail=QUOTA),
            "disk_full",
            "EDQUOT:/home/me/ckpt/step_100.pt",
            None,
        ),  # a quota is not readable
        (
            Observations(
                signal=6,
                reached_first_step=True,
                output_lines=9,
                stderr_tail=("write failed: ENOSPC",),
            ),
            "disk_full",
            "ENOSPC",
            "room on the job’s working directory",
        ),
        (
            Observations(
                exit_code=1, reached_first_step=True, output_lines=9, stderr_tail=SURVIVED
            ),
            "crashed",
            "cuda_error",
            None,
        ),  # a full cache survived earlier is not the death
        (
            Observations(exit_code=0, reached_first_step=True, output_lines=9, stderr_tail=SAVE),
            "completed",
            "exit_code_0",
            None,
        ),
        (
            Observations(
                signal=15, reached_first_step=True, stderr_tail=SAVE, ended_by=EndedBy.STOP
            ),
            "stopped",
            "stop_requested",
            None,
        ),
    ],
)
def test_disk_full_is_read_from_the_deaths_own_lines(
    obs: Observations, verdict: str, reason: str, held: str | None
) -> None:
    state = step(step(fresh(), Started(), 0.0)[0], launch_heard(0.0), 0.0)[0]
    state, effects = step(state, died(1, obs, 60.0), 60.0)
    exit_record = next(e for e in effects if isinstance(e, WriteRecord) and e.event is Event.EXIT)
    assert (exit_record.fields["verdict"], exit_record.fields["reason"]) == (verdict, reason)
    restart = [e for e in effects if isinstance(e, WriteRecord) and e.event is Event.RESTART]
    assert [r.fields.get("held_until") for r in restart] == ([held] if restart else [])
    assert (state.ledger.hold.describe() if state.ledger.hold else None) == held


POLICY = RestartConfig(early_retries=3, runtime_retries=5, backoff_initial_s=2.0)
FULL = Observations(exit_code=1, reached_first_step=True, output_lines=9, stderr_tail=SAVE)
GIB = 1 << 30


def fresh() -> DaemonState:
    ledger = Ledger(goodput=GoodputLedger(first_start=1.0, gap_since=0.0))
    return DaemonState(rules=Rules(policy=POLICY), ledger=ledger)


def died(run_no: int, obs: Observations, at: float, *, started: float = 0.0) -> ChildExited:
    times = RunTimes(started, started + 1.0, at - 0.5)
    facts = RunFacts(
        run_no, obs, at - started, ended_at=1000.0 + at, times=times, died_mono=at, step=100
    )
    return ChildExited(facts, jitter=0.0)


def test_transition_disk_full_waits_for_room_then_relaunches_and_pages_once() -> None:
    state = step(fresh(), Started(), 0.0)[0]
    state = step(state, launch_heard(0.1), 0.1)[0]
    state, first = step(state, died(1, FULL, 60.0, started=0.1), 60.0)
    assert [e.kind.value for e in first if isinstance(e, SendAlert)] == ["disk_full"]
    state, due = step(state, DeadlineDue(Deadline.RESTART), 62.0)
    assert due == (LookForRelease(room_of="/ckpt/step_100.pt"),)  # the room is read, too
    for at in (62.1, 67.1, 72.1):  # still full: no launch, looked at again
        state, held = step(state, ReleaseLooked(None, room=(1024, 100 * GIB)), at)
        assert held == () and state.deadlines.release_check_at == at + HOLD_LOOK_S
        state, due = step(state, DeadlineDue(Deadline.RELEASE_CHECK), at + HOLD_LOOK_S)
        assert due == (LookForRelease(room_of="/ckpt/step_100.pt"),)
    state, go = step(state, ReleaseLooked(None, room=(8 * GIB, 100 * GIB)), 80.0)
    over = [e for e in go if isinstance(e, WriteRecord) and e.event is Event.HOLD_OVER]
    assert [o.fields["waited_for"] for o in over] == ["room on /ckpt/step_100.pt"]
    assert any(isinstance(e, Launch) for e in go) and state.ledger.hold is None
    state = step(state, launch_heard(80.2, 2), 80.2)[0]
    # full again before passing step 100: one more of the same incident, nobody paged again
    state, second = step(state, died(2, FULL, 90.0, started=80.2), 90.0)
    assert not [e for e in second if isinstance(e, SendAlert)]
    assert state.ledger.hold is not None


def test_a_small_filesystem_has_room_at_five_percent_and_an_unreadable_one_holds_nothing() -> None:
    state = step(fresh(), Started(), 0.0)[0]
    state = step(state, launch_heard(0.1), 0.1)[0]
    state = step(state, died(1, FULL, 60.0, started=0.1), 60.0)[0]
    state = step(state, DeadlineDue(Deadline.RESTART), 62.0)[0]
    small = 64 << 20  # a 64 MiB tmpfs: 5 % of it is room enough
    assert not any(
        isinstance(e, Launch)
        for e in step(state, ReleaseLooked(None, room=(1 << 20, small)), 62.1)[1]
    )
    assert any(
        isinstance(e, Launch)
        for e in step(state, ReleaseLooked(None, room=(4 << 20, small)), 62.1)[1]
    )
    assert any(isinstance(e, Launch) for e in step(state, ReleaseLooked(None, room=None), 62.1)[1])


def test_disk_full_pages_by_default_and_alerts_on_names_it() -> None:
    assert "disk_full" in [k.value for k in ALERTED_BY_DEFAULT]
    config = parse_config({"command": ["true"], "alerts": {"on": ["disk_full", "fatal"]}})
    assert [k.value for k in config.alerts.on] == ["disk_full", "fatal"]
    with pytest.raises(ConfigError, match="unknown alert kind 'disk_ful'"):
        parse_config({"command": ["true"], "alerts": {"on": ["disk_ful"]}})


JOB = """
import pathlib
data = b"x" * (1 << 20)
print("saving a checkpoint of 1 MiB", flush=True)
pathlib.Path("ckpt.bin").write_bytes(data)
print("saved", flush=True)
"""


@pytest.fixture
def full_tmpfs(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A 4 MiB tmpfs, all but 16 KiB of it taken by a ballast file (root only)."""
    with tmpfs(tmp_path / "ckpt", "4m") as mount:
        ballast = mount / "ballast"
        with ballast.open("wb") as out:
            out.write(b"\0" * ((4 << 20) - (16 << 10)))
        yield mount, ballast


def _status(home: Path) -> dict[str, object]:
    shown = run_cli("status", "--home", str(home), "--json")
    return dict(json.loads(shown.stdout))


def _until(check: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "not within the bound"
        time.sleep(0.2)  # status is read, not waited on: a pace


def test_a_job_on_a_full_tmpfs_waits_for_room_and_completes_once_room_returns(
    start_daemon: Callable[..., Daemon], full_tmpfs: tuple[Path, Path], tmp_path: Path
) -> None:
    mount, ballast = full_tmpfs
    script = tmp_path / "save.py"
    script.write_text(JOB)
    alerts = tmp_path / "alerts.jsonl"
    daemon = start_daemon(
        [sys.executable, str(script)],
        restart={"early_retries": 5},
        cwd=str(mount),
        alerts={"file": str(alerts)},
    )
    exit_1 = daemon.wait_event("exit", timeout=60)
    assert (exit_1.fields["verdict"], exit_1.fields["reason"]) == ("disk_full", "ENOSPC")
    restart = daemon.wait_event("restart")
    assert restart.fields["held_until"] == "room on the job’s working directory"
    _until(lambda: _status(daemon.home).get("restart_held_until") is not None, 30)
    shown = run_cli("status", "--home", str(daemon.home))
    assert "held until room on the job’s working directory" in shown.stdout
    # held: over more than one look (5 s), nothing is launched into the full disk
    span = time.monotonic() + 6.0
    while time.monotonic() < span:
        assert [r.run for r in daemon.events("spawn")] == [1]
        time.sleep(0.5)  # absence over a span: read again until it has passed
    ballast.unlink()
    over = daemon.wait_event("hold_over", timeout=30)
    assert over.fields["waited_for"] == "room on the job’s working directory"
    assert int(over.fields["free_bytes"]) >= 1 << 20
    assert daemon.wait(60) == 0
    verdicts = [(r.run, r.fields["verdict"]) for r in daemon.events("exit")]
    assert verdicts == [(1, "disk_full"), (2, "completed")]
    sent = [json.loads(line)["verdict"] for line in alerts.read_text().splitlines()]
    assert sent == ["disk_full"]  # one page, and no `recovered` (the default pages none for it)
    assert isinstance(exit_1, EventRecord)
