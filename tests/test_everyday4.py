"""Everyday paths III (issue 44), the first items, through the real CLI.

- The pm2 habit: ``dflashd start train.py`` and ``dflashd start 'python train.py'`` say what
  was meant and launch nothing (no home made, no record, no page), exit 2.
- A bare ``dflashd`` prints its help and exits 0.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dflashd.supervisor.client.cmdhint import command_hint


def dflashd(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "dflashd.supervisor", *args]
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize(
    ("command", "meant"),
    [
        (["train.py"], "`dflashd start -- python train.py`"),
        (["train.py", "--lr", "3e-4"], "`dflashd start -- python train.py --lr 3e-4`"),
        (["python train.py --lr 3e-4"], "`dflashd start -- python train.py --lr 3e-4`"),
        (["run.sh"], "`dflashd start -- bash run.sh`"),
        # issue 54: a path to a script that is not executable
        (
            ["./train.py", "--lr", "3"],
            "not executable; did you mean `dflashd start -- python ./train.py --lr 3`",
        ),
    ],
)
def test_a_script_named_like_pm2_is_refused_with_what_was_meant(
    tmp_path: Path, command: list[str], meant: str
) -> None:
    (tmp_path / "train.py").write_text("print('step 1')\n")
    (tmp_path / "run.sh").write_text("echo step 1\n")
    home = tmp_path / "home"
    done = dflashd("start", "--home", str(home), *command, cwd=tmp_path)
    assert done.returncode == 2, done
    assert meant in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert not home.exists()  # nothing launched, nothing recorded, nobody paged


def test_commands_that_run_or_are_merely_unknown_get_no_hint(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    env = {"PATH": "/usr/bin:/bin"}
    assert command_hint(["python3", "train.py"], tmp_path, env) is None
    (tmp_path / "train.py").chmod(0o755)
    assert command_hint(["./train.py"], tmp_path, env) is None  # executable: the spawn decides
    assert command_hint(["no-such-tool", "x"], tmp_path, env) is None  # left to spawn_failed
    assert command_hint(["no such tool at all"], tmp_path, env) is None
    assert command_hint([], tmp_path, env) is None


def test_a_bare_dflashd_prints_its_help_and_succeeds(tmp_path: Path) -> None:
    done = dflashd(cwd=tmp_path)
    assert done.returncode == 0, done
    assert "Usage:" in done.stdout and "Commands:" in done.stdout and "start" in done.stdout


def test_short_options_and_a_success_that_says_ended(tmp_path: Path) -> None:
    """``-c/--config`` and ``-t/--timeout``, as every CLI user types them; a job that completes
    during ``start``'s wait "ended: completed", it did not "die"."""
    config = tmp_path / "c.toml"
    config.write_text('gpus = "none"\n')
    home = str(tmp_path / "home")
    done = dflashd(
        "start",
        "-c",
        str(config),
        "--home",
        home,
        "--",
        sys.executable,
        "-c",
        "print(1)",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done
    assert "run 1 ended: completed (exit_code_0)" in done.stderr and "died" not in done.stderr
    stopped = dflashd("stop", "-t", "5", "--home", home, cwd=tmp_path)
    assert stopped.returncode in (0, 3), stopped  # stopped, or already gone after completing
    for command in ("start", "stop", "restart"):
        text = dflashd(command, "--help", cwd=tmp_path).stdout
        assert ("-c, --config" in text) or ("-t, --timeout" in text), (command, text)


def test_journalctls_time_forms_are_understood() -> None:
    """``--since '10 min ago'``, ``today``, ``yesterday``, ``04:40``: what a journalctl user types."""
    from datetime import UTC, datetime

    from dflashd.supervisor.client.common import parse_since

    now = datetime(2026, 12, 2, 13, 0, 0).astimezone().timestamp()  # 13:00 local

    def local(stamp: str) -> datetime:
        return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).astimezone()

    assert local(parse_since("10 min ago", now)).strftime("%H:%M") == "12:50"
    assert local(parse_since("2 hours ago", now)).strftime("%H:%M") == "11:00"
    assert local(parse_since("today", now)).strftime("%d %H:%M") == "02 00:00"
    assert local(parse_since("yesterday", now)).strftime("%d %H:%M") == "01 00:00"
    assert local(parse_since("04:40", now)).strftime("%d %H:%M:%S") == "02 04:40:00"
    with pytest.raises(Exception, match="journalctl"):
        parse_since("last tuesday", now)


def test_restart_no_wait_returns_once_the_job_is_launched_and_tail_takes_since(
    tmp_path: Path,
) -> None:
    """``restart --no-wait`` as ``start --no-wait``: back at once, the job launched again;
    ``tail --since '10 min ago'`` shows the runs."""
    config = tmp_path / "c.toml"
    config.write_text('gpus = "none"\n')
    home = str(tmp_path / "home")
    job = [sys.executable, "-c", "import time\nprint('step 1', flush=True)\ntime.sleep(600)"]
    done = dflashd(
        "start", "--no-wait", "-c", str(config), "--home", home, "--", *job, cwd=tmp_path
    )
    assert done.returncode == 0, done
    try:
        again = dflashd("restart", "--no-wait", "-t", "5", "--home", home, cwd=tmp_path)
        assert again.returncode == 0, again
        assert "run 2" in again.stderr + again.stdout, again
        shown = dflashd("tail", "--since", "10 min ago", "--home", home, cwd=tmp_path)
        assert shown.returncode == 0 and "spawn" in shown.stdout, shown
    finally:
        dflashd("stop", "-t", "5", "--home", home, cwd=tmp_path)


@pytest.mark.parametrize(
    ("typed", "meant"),
    [("top", "dflashd status"), ("kill", "dflashd stop"), ("stat", "dflashd status")],
)
def test_other_tools_habits_get_what_they_are_here(tmp_path: Path, typed: str, meant: str) -> None:
    done = dflashd(typed, cwd=tmp_path)
    assert done.returncode == 2 and meant in done.stderr, done


def test_a_typo_is_never_steered_to_a_command_that_ends_the_job(tmp_path: Path) -> None:
    for typed in ("stpo", "restrat", "top"):
        done = dflashd(typed, cwd=tmp_path)
        assert done.returncode == 2, done
        assert "'stop'" not in done.stderr and "'restart'" not in done.stderr, done


LOADED = r"""
import sys
from dflashd.supervisor.client.cli import main
try:
    main(sys.argv[1:], prog_name="dflashd")
except SystemExit:
    pass
print("LOADED", *sorted(m for m in sys.modules if m.startswith("dflashd.supervisor.client.")))
"""


@pytest.mark.parametrize(
    ("words", "loads"),
    [
        (["status", "--home", "HOME"], set()),
        (["tail", "--help"], {"logcmds"}),
        (["lgos"], {"logcmds", "stackscmd"}),  # no command: all of them, for the suggestion
        (["--help"], {"logcmds", "stackscmd"}),
    ],
)
def test_the_commands_of_other_modules_load_only_when_named(
    tmp_path: Path, words: list[str], loads: set[str]
) -> None:
    """``start`` and ``status`` never load ``tail``'s or ``stacks``' modules (a start's CPU);
    a command named, ``--help`` and a word that is no command load them, so help lists every
    command and a typo still gets its nearest."""
    argv = [str(tmp_path / "h") if w == "HOME" else w for w in words]
    done = subprocess.run(
        [sys.executable, "-c", LOADED, *argv], capture_output=True, text=True, cwd=tmp_path
    )
    loaded = {m.rsplit(".", 1)[1] for m in done.stdout.rsplit("LOADED", 1)[1].split()}
    assert loaded & {"logcmds", "stackscmd"} == loads, done
    if words == ["lgos"]:
        assert "'logs'" in done.stderr, done
    if words == ["--help"]:
        listed = done.stdout.split("Commands:")[1]
        assert all(f"  {name} " in listed for name in ("logs", "tail", "report", "stacks")), done


def test_lightnings_rich_bar_wrapped_in_a_pipe_still_gives_the_loss(
    start_daemon: Any,
) -> None:
    """Rich in a narrow terminal or a pipe puts ``train_loss: 0.112`` on the line after the
    bar: the loss is read all the same (status, the progress records, the report's curve)."""
    job = (
        "import sys, time\n"
        "for i in range(1, 4):\n"
        "    bar = f'Epoch 0/9  ━━━━━━━━━━ {i}/18 0:00:17 • 0:01:02 4.47it/s v_num: 1'\n"
        "    sys.stdout.write(bar + '\\ntrain_loss: 0.112\\n'); sys.stdout.flush()\n"
        "    time.sleep(0.3)\n"
        "time.sleep(600)\n"
    )
    daemon = start_daemon([sys.executable, "-c", job])
    record = daemon.wait_for(
        lambda r: getattr(r, "event", None) == "progress" and "loss" in r.fields
    )
    assert record.fields["loss"] == 0.112  # type: ignore[attr-defined]


def test_the_example_config_turns_no_default_alert_off() -> None:
    """Installing systemd/dflashd.toml.example keeps every alert on by default (recovered,
    rendezvous_timeout, waiting, slow, diverged included)."""
    import tomllib

    from dflashd.supervisor.host.config import parse_config
    from dflashd.supervisor.model.rules import ALERTED_BY_DEFAULT

    example = Path(__file__).parent.parent / "systemd" / "dflashd.toml.example"
    config = parse_config(tomllib.loads(example.read_text()))
    assert set(config.alerts.on) == set(ALERTED_BY_DEFAULT)  # a rule's verdicts too (disk_full)
    # and the lists a user copies from the README and the guide
    root = Path(__file__).parent.parent
    for doc in ("README.md", "docs/guide.md"):
        for listed in re.findall(r'on = \[([^\]]*"fatal"[^\]]*)\]', (root / doc).read_text()):
            names = set(re.findall(r'"([a-z_]+)"', listed))
            assert {k.value for k in ALERTED_BY_DEFAULT} <= names, (doc, listed)


def test_one_job_per_home_a_warning_and_ls_lists_every_daemon(tmp_path: Path) -> None:
    """A second job brought into a home with history is named, with the home to use instead;
    ``dflashd ls`` lists the running daemon: home, state, run and command."""
    config = tmp_path / "c.toml"
    config.write_text('gpus = "none"\n')
    home = tmp_path / "home"
    (tmp_path / "train.py").write_text(
        "import time\nprint('step 1', flush=True)\ntime.sleep(600)\n"
    )
    first = [sys.executable, "-c", "import time\nprint('step 1', flush=True)\ntime.sleep(600)"]
    done = dflashd(
        "start", "--no-wait", "-c", str(config), "--home", str(home), "--", *first, cwd=tmp_path
    )
    assert done.returncode == 0 and "another job" not in done.stderr, done
    try:
        listed = dflashd("ls", "--json", cwd=tmp_path)
        rows = [json.loads(line) for line in listed.stdout.splitlines()]
        mine = [r for r in rows if r["home"] == str(home)]
        assert mine and mine[0]["running"] and mine[0]["command"].startswith(sys.executable)
        assert str(home) in dflashd("ls", cwd=tmp_path).stdout
    finally:
        dflashd("stop", "-t", "5", "--home", str(home), cwd=tmp_path)
    second = [sys.executable, "train.py"]
    again = dflashd(
        "start", "--no-wait", "-c", str(config), "--home", str(home), "--", *second, cwd=tmp_path
    )
    try:
        assert again.returncode == 0, again
        assert "ran another job before" in again.stderr
        assert f"--home {tmp_path / 'dflashd-train'}" in again.stderr
    finally:
        dflashd("stop", "-t", "5", "--home", str(home), cwd=tmp_path)


def test_tail_shows_the_job_and_dflashds_events_and_the_per_step_records_on_request(
    tmp_path: Path,
) -> None:
    """A plain ``step N`` job: ``tail`` shows its lines and dflashd's events (spawn, launched,
    exit), not a ``progress`` echo of each step; ``--all`` and ``--json`` show every record."""
    config = tmp_path / "c.toml"
    config.write_text('gpus = "none"\n')
    home = str(tmp_path / "home")
    job = "import time\nfor i in range(1, 30):\n    print(f'step {i} loss 2.0', flush=True)\n    time.sleep(0.1)"
    argv = ["start", "--foreground", "--quiet", "-c", str(config), "--home", home, "--"]
    done = dflashd(*argv, sys.executable, "-c", job, cwd=tmp_path)  # until the job completes
    assert done.returncode == 0, done
    try:
        shown = dflashd("tail", "-n", "200", "--home", home, cwd=tmp_path).stdout
        assert "step 29 loss 2.0" in shown and "spawn" in shown and "exit" in shown
        assert "progress" not in shown and "child_status" not in shown
        every = dflashd("tail", "-n", "200", "--all", "--home", home, cwd=tmp_path).stdout
        assert "progress" in every
        raw = dflashd("tail", "-n", "200", "--json", "--home", home, cwd=tmp_path).stdout
        assert '"event":"progress"' in raw
    finally:
        dflashd("stop", "-t", "5", "--home", home, cwd=tmp_path)


def test_the_reports_loss_axis_stays_at_or_above_zero_and_durations_read_as_elsewhere() -> None:
    """A loss near zero is drawn on an axis from 0 (never a negative label), and a run's
    duration reads as status says it (``1m05s``), the dates with their year."""
    from datetime import UTC, datetime

    from dflashd.supervisor.client.htmlreport import _line_chart
    from dflashd.supervisor.client.runtable import seconds_text as _seconds_text
    from dflashd.supervisor.client.svgaxis import axis_svg

    chart = _line_chart("Loss", {"r1": ("#000", [(0.0, 0.01), (10.0, 0.30)])}, 0.0, 10.0, "", False)
    assert 'text-anchor="end">0</text>' in chart and ">-" not in chart
    assert _seconds_text(65.0) == "1m05s" and _seconds_text(3.21) == "3.2s"
    start = datetime(2026, 12, 2, 13, 0, tzinfo=UTC).timestamp()
    assert ">2026-12-02 13:00<" in axis_svg(start, start + 3600.0, 100)
