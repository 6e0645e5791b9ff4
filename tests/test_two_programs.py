"""The client and the daemon are two programs (issue 52; docs/design.md, "The client and the
daemon"): ``start --foreground`` checks, takes the home, then becomes the daemon program in
the same process, and hands the job none of what it handed itself."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from dflashd.logs import EventRecord, read_records
from dflashd.supervisor.client.listing import daemon_homes
from dflashd.supervisor.host.config import load_config
from dflashd.supervisor.host.handover import (
    HANDOVER_OPTION,
    Handover,
    handover_file,
    take_handover,
)
from dflashd.supervisor.host.home import Home
from tests.conftest import Daemon, daemon_argv

# The job writes what its open fds point at, then waits to be stopped.
FD_LISTER = (
    "import os, sys, time\n"
    "fds = {fd: os.readlink(f'/proc/self/fd/{fd}') for fd in map(int, os.listdir('/proc/self/fd'))"
    " if os.path.exists(f'/proc/self/fd/{fd}')}\n"
    "tmp = sys.argv[1] + '.tmp'\n"
    "open(tmp, 'w').write(repr(fds))\n"
    "os.replace(tmp, sys.argv[1])\n"
    "time.sleep(120)\n"
)


def _wait_for_file(path: Path, daemon: Daemon, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return path.read_text()
        assert daemon.proc.poll() is None, daemon.proc.communicate()
        time.sleep(0.05)  # a bounded poll: the job writes the file once it runs
    raise AssertionError(f"the job never wrote {path}; log: {daemon.records()[-5:]}")


def _parent_of(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


def test_start_foreground_becomes_the_daemon_and_the_job_inherits_nothing_of_it(
    start_daemon: Callable[..., Daemon], tmp_path: Path, home: Path
) -> None:
    listing = tmp_path / "fds.txt"
    daemon = start_daemon([sys.executable, "-c", FD_LISTER, str(listing)])
    fds = _wait_for_file(listing, daemon)
    # the same process: the pid the test started serves the home and holds its lock
    assert (home / "dflashd.lock").read_text().strip() == str(daemon.proc.pid)
    job = daemon.wait_event("launched").fields["pid"]  # the job is the daemon's own child
    assert _parent_of(int(job)) == daemon.proc.pid
    words = (Path(f"/proc/{daemon.proc.pid}/cmdline").read_bytes()).split(b"\0")
    shown = [w.decode() for w in words if w]
    assert shown[1:4] == ["-P", "-m", "dflashd.supervisor.daemon"], shown
    assert ["start", "--foreground", "--home", str(home)] == shown[6:10], shown
    assert shown[shown.index("--") + 1 :][:2] == [sys.executable, "-c"]
    assert daemon_homes().get(str(home)) == os.getuid()  # `dflashd ls` finds it
    # neither the lock (a dead daemon's home would stay locked) nor the hand-over reach the job
    assert "dflashd.lock" not in fds and "dflashd-handover" not in fds, fds
    daemon.stop()
    assert daemon.proc.returncode == 0


@pytest.mark.parametrize("stdin", [b"", b"\x80\x05not a pickle", b"\x80\x04K\x07."])
def test_the_daemon_program_started_by_hand_says_how_to_start_it(
    tmp_path: Path, stdin: bytes
) -> None:
    """No hand-over, or an fd holding nothing, garbage, or a pickle of something else: one
    line naming ``dflashd start``, exit 2, nothing made."""
    given = tmp_path / "given"
    given.write_bytes(stdin)
    program = [sys.executable, "-m", "dflashd.supervisor.daemon"]
    work = tmp_path / "work"
    work.mkdir()
    for extra in ([], ["--handover-fd", "0"], ["start", "--foreground"]):
        with open(given, "rb") as fd0:
            done = subprocess.run(
                [*program, *extra],
                stdin=fd0,
                capture_output=True,
                cwd=work,
                text=True,
                timeout=60,
                check=False,
            )
        assert done.returncode == 2, (extra, done.stderr)
        assert done.stderr.count("\n") == 1 and done.stderr.startswith("dflashd: "), done.stderr
        assert "dflashd start" in done.stderr, done.stderr
        assert not list(work.iterdir())  # nothing made, nothing launched


def test_a_stop_while_the_daemon_program_loads_is_a_clean_stop(home: Path) -> None:
    """SIGTERM (a unit's stop) or Ctrl-C just after ``start --foreground`` became the daemon
    program, while it still loads its modules: held back until its loop takes its signals,
    then an ordinary stop with every record, never a death with nothing recorded."""
    proc = subprocess.Popen(
        daemon_argv(home, command=[sys.executable, "-c", "import time; time.sleep(60)"]),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    cmdline = Path(f"/proc/{proc.pid}/cmdline")
    deadline = time.monotonic() + 30
    while b"dflashd.supervisor.daemon" not in cmdline.read_bytes():
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.001)  # a bounded poll: the exec is seen within a millisecond of it
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "Traceback" not in err, err
    events = [r.event for r in read_records(home / "logs") if isinstance(r, EventRecord)]
    assert events[-1] == "daemon_exit", events
    assert events[-4:-1] == ["launched", "stopping", "exit"], events  # an ordinary stop


@pytest.mark.parametrize("memfd", [True, False], ids=["memfd", "no-memfd"])
def test_the_hand_over_comes_back_whole_with_or_without_memory_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, memfd: bool
) -> None:
    """What ``start`` checked is what the program serves, including where the kernel or a
    sandbox has no memfd_create (then an unlinked file of the home holds it)."""
    home = Home(tmp_path / "home")
    home.root.mkdir()
    config = load_config(None, ("python", "train.py", "--lr", "3e-4"))
    sent = Handover(home, config, None, echo=True, saved=(None, ("python", "train.py")))
    if not memfd:

        def no_memfd(name: str, flags: int = 0) -> int:
            raise OSError(errno.ENOSYS, "Function not implemented")

        monkeypatch.setattr(os, "memfd_create", no_memfd)
    fd = handover_file(sent)
    assert take_handover([HANDOVER_OPTION, str(fd), "start", "--foreground"]) == sent
    assert list(home.root.iterdir()) == []  # nothing left behind in the home
    with pytest.raises(OSError):
        os.fstat(fd)  # read once and closed
