"""Issue 21, part 5: what the job prints and what the user types never freeze or crash dflashd.

- matching is linear: long lines holding the keywords of every format match quickly
  (a hypothesis property over random long lines, with the adversarial shapes the issue
  found: a run of digits ending in ``it/s``, a run of spaces after ``step``);
- state.json stays small whatever the job printed before dying, so a later daemon still
  gives a SIGKILLed daemon's run its exit record;
- bad config and command lines exit 2 with one line, launching nothing.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from dflashd.supervisor.model.formats import MAX_MATCH_CHARS, FormatMatcher, match_line
from tests.conftest import Daemon, child, run_cli, write_config

KEYWORDS = [
    "step",
    "Step",
    "iter",
    "iteration",
    "Epoch",
    "it/s",
    "s/it",
    "it [",
    "loss",
    "%|",
    "|",
    "/",
    "[",
    ":",
    "=",
]
PIECES = st.one_of(
    st.sampled_from(KEYWORDS),
    st.text(alphabet="0123456789", min_size=1, max_size=5000),
    st.text(alphabet=" \t", min_size=1, max_size=5000),
    st.text(alphabet="ab|%/:=.", min_size=1, max_size=200),
)


@settings(max_examples=60, deadline=2000)
@given(st.lists(PIECES, min_size=1, max_size=40))
def test_matching_a_long_line_with_keywords_is_bounded(pieces: list[str]) -> None:
    """Whatever the line (up to 64 KiB here), matching finishes and sees only its head."""
    line = "".join(pieces)[: 64 * 1024]
    assert match_line(line) == match_line(line[:MAX_MATCH_CHARS])
    FormatMatcher().last_step([line, line])


@settings(max_examples=5, deadline=2000)
@given(st.sampled_from(["it/s", " it/s", "step", "Step: ", "iteration ", "loss="]))
def test_the_adversarial_shapes_stay_cheap(tail: str) -> None:
    """The issue's lines: 50 KB of digits ending in it/s, 60,000 spaces around a keyword."""
    assert match_line("1" * 50_000 + tail) is None or True  # must return, not hang
    assert match_line("step" + " " * 60_000 + "12") is None
    assert match_line(" " * 60_000 + "step 12") is None  # past the matched head
    assert match_line("step 12 " + " " * 60_000) is not None


def test_state_json_stays_readable_after_a_death_full_of_control_bytes(
    tmp_path: Path, home: Path
) -> None:
    """Run 1 dies printing 64 KiB lines of control bytes; the daemon is SIGKILLed while run 2
    lives: state.json stays small, and the next daemon gives run 2 its exit record (lost)."""
    marker = tmp_path / "second"
    job = (
        "import os, sys, threading\n"
        f"if os.path.exists({str(marker)!r}):\n"
        "    print('second run', flush=True)\n"
        "    threading.Event().wait()\n"
        f"open({str(marker)!r}, 'w').close()\n"
        "for _ in range(30):\n"
        "    sys.stderr.write('\\x01\\x02' * 30000 + '\\n')\n"
        "sys.stderr.flush()\n"
        "sys.exit(3)\n"
    )
    config = write_config(
        tmp_path / "c.toml",
        {"gpus": "none"},
        restart={"early_retries": 5, "backoff_initial_s": 0.0, "backoff_max_s": 1.0},
    )
    first = Daemon(home, config, [sys.executable, "-c", job])
    second: Daemon | None = None
    try:
        first.wait_for(lambda r: getattr(r, "event", None) == "launched" and r.run == 2)
        deadline = time.monotonic() + 10
        state = home / "state.json"
        while '"run": 2' not in state.read_text() or '"child"' not in state.read_text():
            assert time.monotonic() < deadline  # a file has no event to wait on
            time.sleep(0.02)
        assert state.stat().st_size < 256 * 1024, state.stat().st_size
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(10)
        second = Daemon(home, config, child("exit_silent.py"))
        second.wait_for(lambda r: getattr(r, "event", None) == "exit" and r.run == 2)
        exits = {r.run: r.fields for r in second.events("exit")}
        assert exits[1]["verdict"] == "crash_before_first_step"
        assert len(exits[1]["tail"]) > 0  # the exit record keeps the tail in full
        assert exits[2]["verdict"] == "lost"
    finally:
        for daemon in (first, second):
            if daemon is not None:
                daemon.stop()
                for pipe in (daemon.proc.stdout, daemon.proc.stderr):
                    if pipe is not None:
                        pipe.close()


def test_a_config_that_is_a_fifo_is_refused_at_once(tmp_path: Path, home: Path) -> None:
    fifo = tmp_path / "c.toml"
    os.mkfifo(fifo)
    result = run_cli("start", "--home", str(home), "--config", str(fifo), "--", "true", timeout=20)
    assert result.returncode == 2 and "not a regular file" in result.stderr
    assert result.stderr.count("\n") == 1 and not (home / "logs" / "dflashd.jsonl").exists()


def test_deeply_nested_toml_is_one_line(tmp_path: Path, home: Path) -> None:
    deep = tmp_path / "c.toml"
    deep.write_text("a = " + "[" * 5000 + "]" * 5000 + "\n")
    result = run_cli("start", "--home", str(home), "--config", str(deep), "--", "true")
    assert result.returncode == 2 and "nested too deeply" in result.stderr
    assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1


def test_env_keys_the_environment_cannot_hold_are_refused(tmp_path: Path, home: Path) -> None:
    for key in ("A=B", ""):
        config = tmp_path / "c.toml"
        config.write_text(f'gpus = "none"\n[env]\n"{key}" = "x"\n')
        result = run_cli("start", "--home", str(home), "--config", str(config), "--", "true")
        assert result.returncode == 2 and "variable name" in result.stderr, result.stderr
        assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1
    assert not (home / "logs" / "dflashd.jsonl").exists()


def test_a_non_utf8_argument_is_refused_with_its_bytes_shown(tmp_path: Path, home: Path) -> None:
    import subprocess

    from tests.helpers import dflashd_argv

    config = write_config(tmp_path / "c.toml", {"gpus": "none"})
    argv = [
        os.fsencode(a) for a in dflashd_argv("start", "--home", str(home), "--config", str(config))
    ]
    result = subprocess.run(
        [*argv, b"--", b"python3", b"caf\xe9.py"], capture_output=True, timeout=30, check=False
    )
    err = result.stderr.decode("utf-8", "replace")
    assert result.returncode == 2 and "not UTF-8" in err and "caf\\xe9.py" in err
    assert "Traceback" not in err and err.count("\n") == 1
    assert not (home / "invocation.json").exists()
