"""Shared fixtures: a temp home, the daemon as a real process, waiting on its log (helpers.py: the rest)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Final

import pytest

from dflashd.logs import EventRecord, Record, follow, read_records
from tests.helpers import (  # the tests import them here
    child,
    daemon_argv,
    dflashd_argv,
    run_cli,
    write_config,
)

__all__ = ["Daemon", "child", "daemon_argv", "dflashd_argv", "run_cli", "write_config"]

FAST_RESTART = {
    "backoff_initial_s": 0.0,
    "backoff_max_s": 1.0,
    "early_retries": 0,
    "stop_timeout_s": 5.0,
}


class Daemon:
    """A foreground daemon process on a temp home."""

    def __init__(
        self, home: Path, config: Path, command: list[str] | None, gpu_script: Path | None = None
    ) -> None:
        self.home = home
        if gpu_script is None:
            argv = daemon_argv(home, config)
        else:  # the real daemon with a scripted GPU sampler injected (tests/scripted_daemon.py)
            runner = str(Path(__file__).parent / "scripted_daemon.py")
            argv = [sys.executable, runner, str(gpu_script), str(home), str(config)]
        if command:
            argv += ["--", *command]
        env = dict(os.environ)
        env.pop("NOTIFY_SOCKET", None)
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )

    def wait(self, timeout: float = 60) -> int:
        """Wait for the daemon to exit (an event: the process ends)."""
        return self.proc.wait(timeout)

    def records(self) -> list[Record]:
        """Everything in the run log so far."""
        return list(read_records(self.home / "logs"))

    def events(self, name: str) -> list[EventRecord]:
        """Supervisor records with this event name."""
        return [r for r in self.records() if isinstance(r, EventRecord) and r.event == name]

    def stacks_text(self) -> str:
        """Every stack dump of the runs: the py-spy files, and faulthandler's lines on stderr."""
        files = sorted((self.home / "logs" / "stacks").glob("*.txt"))
        dumped = "\n".join(path.read_text() for path in files)
        stderr = [r.line for r in self.records() if getattr(r, "src", "") == "stderr"]
        return dumped + "\n" + "\n".join(stderr)

    def wait_for(self, predicate: Callable[[Record], bool], timeout: float = 30) -> Record:
        """Follow the log until a record matches (bounded by the deadline)."""
        deadline = time.monotonic() + timeout
        records = follow(
            self.home / "logs", poll_s=0.02, should_stop=lambda: time.monotonic() > deadline
        )
        with closing(records):
            for record in records:
                if predicate(record):
                    return record
        raise AssertionError(f"no matching record within {timeout}s; log: {self.records()[-10:]}")

    def wait_event(self, name: str, timeout: float = 30) -> EventRecord:
        """Follow the log until a supervisor record named ``name`` appears."""
        rec = self.wait_for(lambda r: isinstance(r, EventRecord) and r.event == name, timeout)
        assert isinstance(rec, EventRecord)
        return rec

    def stop(self) -> None:
        """Stop it if it still runs (test cleanup)."""
        if self.proc.poll() is None:
            run_cli("stop", "--home", str(self.home), "--timeout", "2")
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _gpu_available() -> str | None:
    """None when NVML and a CUDA torch both work; otherwise why not."""
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
    except Exception as exc:
        return f"no NVML here ({exc.__class__.__name__})"
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    return None if torch.cuda.is_available() else "torch sees no CUDA device"


# The suite's longest tests (real daemons, torchrun rendezvous and real hangs: 10-60 s each on
# the 2-core machine, `pytest --durations=40`), longest first.  Each worker starts on its share
# of them, so that none starts late and the suite's end waits on it alone (a longest-first
# schedule).  A name that matches no test fails tests/test_schedule.py.
LONGEST_FIRST: Final = (
    "tests/multinode/test_remote_wait.py::test_every_rank_of_every_node",
    "tests/multinode/test_remote_wait.py::test_a_rank_waiting_in_a_barrier",
    "tests/multinode/test_two_nodes.py::test_two_nodes_survive",
    "tests/test_hangs.py::test_waits_outside_the_run",
    "tests/multinode/test_store_faults.py::test_a_frozen_store_host",
    "tests/test_slow_diverged.py::test_a_slowed_rank_under_torchrun",
    "tests/test_hangs.py::test_pauses_that_work",
    "tests/multinode/test_store_faults.py::test_a_restart_round",
    "tests/test_hangs.py::test_a_start_up_waiting_on_a_stale_build_lock",
    "tests/test_slow_diverged.py::test_a_cpu_hog",
    "tests/multinode/test_remote_wait.py::test_a_rank_frozen_in_its_own_code",
    "tests/faults/test_daemon_survives.py::test_a_broken_webhook_never_silences",
    "tests/faults/test_daemon_survives.py::test_a_hung_alert_command",
    "tests/test_alerts_metrics.py::test_hung_webhook_never_blocks",
    "tests/test_hangs.py::test_two_gloo_ranks_one_frozen",
    "tests/test_trainer.py::test_resume_gives_the_same_next_loss",
    "tests/test_world.py::test_the_helper_shares_and_hears",
    "tests/test_world.py::test_a_frozen_store_host_is_an_error",
    "tests/test_trainer.py::test_per_thread_backends",
    "tests/test_stacks.py::test_a_frozen_rank_of_the_bundled_trainer",
    "tests/test_hangs.py::test_a_job_blocked_forever",
    "tests/test_daemon_killed.py::test_a_daemon_killed_mid_hang",
    "tests/test_hangs.py::test_an_early_death_keeps_the_caches",
    "tests/test_alerts_trust.py::test_one_stuck_job_is_one_alert",
    "tests/faults/test_custody.py::test_the_same_home_through_a_symlinked_path",
)


def _longest_first_rank(item: pytest.Item) -> int:
    for rank, prefix in enumerate(LONGEST_FIRST):
        if item.nodeid.startswith(prefix):
            return rank
    return len(LONGEST_FIRST)


def dealt_longest_first(items: list[pytest.Item], workers: int) -> list[pytest.Item]:
    """The order that starts each worker on its share of the longest tests.

    pytest-xdist's ``worksteal`` deals the collection out in ``workers`` contiguous parts
    (part i: a ``1/(workers - i)`` share of what is left) and an idle worker steals from the
    end of another's part: the longest tests go to the front of the parts, dealt round-robin
    longest first, and every other test keeps its order."""
    longest = sorted(
        (item for item in items if _longest_first_rank(item) < len(LONGEST_FIRST)),
        key=_longest_first_rank,
    )
    rest = iter(item for item in items if _longest_first_rank(item) == len(LONGEST_FIRST))
    ordered: list[pytest.Item] = []
    for part in range(workers):
        size = (len(items) - len(ordered)) // (workers - part)
        mine = longest[part::workers]
        ordered += mine
        ordered += [item for _, item in zip(range(size - len(mine)), rest, strict=False)]
    ordered += list(rest)
    return ordered


def pytest_configure(config: pytest.Config) -> None:
    """Every process the suite starts begins with a terminal's SIGINT and SIGQUIT, however the
    suite was run.  Run as a script's background job (``.ci/run &``, ``setsid bash -c … &``) it
    would inherit both ignored, and pass that on across exec; dflashd keeps an inherited ignore
    (as shells expect), so the suite's Ctrl-C and Ctrl-\\ tests would test another thing there
    than here.  Those that want the ignore set it for their own start (tests/faults/test_ctrl_c.py)."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGQUIT) is signal.SIG_IGN:
        signal.signal(signal.SIGQUIT, signal.SIG_DFL)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest tests first (above); GPU tests are skipped, with the reason shown, on
    machines without a GPU."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    items[:] = dealt_longest_first(items, workers)
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    reason = _gpu_available()
    if reason is not None:
        for item in gpu_items:
            item.add_marker(pytest.mark.skip(reason=f"GPU test: {reason}"))


@pytest.fixture(scope="session", autouse=True)
def own_state_directory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The user's state directory (the default home, and the registry of started homes that
    ``ls`` lists: speak/registry.py) is one of this session's, never the real one."""
    patch = pytest.MonkeyPatch()
    patch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("xdg-state")))
    yield
    patch.undo()


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A fresh dflashd home."""
    return tmp_path / "home"


UNLOOKED_FOR: Final = ("slow", "diverged")  # issue 43: a false incident on a healthy run


@pytest.fixture
def start_daemon(
    tmp_path: Path, home: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., Daemon]]:
    """Start a foreground daemon: start_daemon(command, restart={...}, **top_level_config)."""
    started: list[Daemon] = []

    def _start(
        command: list[str] | None,
        restart: dict[str, object] | None = None,
        gpu_script: Path | None = None,
        **top: object,
    ) -> Daemon:
        top.setdefault("gpus", "none" if gpu_script is None else "all")
        tables: dict[str, dict[str, object]] = {"restart": {**FAST_RESTART, **(restart or {})}}
        for name in ("alerts", "logs"):
            table = top.pop(name, None)
            if table is not None:
                assert isinstance(table, dict)
                tables[name] = table
        config = write_config(tmp_path / f"config{len(started)}.toml", top, **tables)
        daemon = Daemon(home, config, command, gpu_script)
        started.append(daemon)
        return daemon

    yield _start
    for daemon in started:
        daemon.stop()
        if daemon.proc.stdout:
            daemon.proc.stdout.close()
        if daemon.proc.stderr:
            daemon.proc.stderr.close()
    if request.node.get_closest_marker("incidents") is None:
        # every real job of the suite is a clean run for the slow and diverged rules
        false = [(e.event, e.fields) for d in started for e in _unlooked_for(d)]
        assert false == [], f"a slow or diverged incident on a run not made so: {false}"


def _unlooked_for(daemon: Daemon) -> list[EventRecord]:
    """The daemon's slow and diverged records.  A log whose files are all plain and never
    name either event is not parsed: a 40 MB flood's records took 9-14 s to read under the
    suite's load, every test's teardown."""
    files = list((daemon.home / "logs").glob("dflashd.jsonl*"))
    needles = [f'"event":"{name}"'.encode() for name in UNLOOKED_FOR]
    if all(path.name.split(".")[-1] not in ("zst", "gz") for path in files) and not any(
        needle in path.read_bytes() for path in files for needle in needles
    ):
        return []
    return [r for r in daemon.records() if isinstance(r, EventRecord) and r.event in UNLOOKED_FOR]
