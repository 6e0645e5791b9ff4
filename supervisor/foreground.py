"""The daemon program around its loop: what ``dflashd start`` handed over becomes a serving
daemon in the same process, with its logging, its echo of the job's output, its first-launch
report and its one-line refusals (docs/design.md, "The client and the daemon").

The daemon class comes in as a parameter, so this module sits below ``daemon.py``, which
holds the program's ``main``.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Protocol

from dflashd.logs.writer import LogWriterError
from dflashd.supervisor.doubles import HostDoubles, StartupError
from dflashd.supervisor.host.config import Config
from dflashd.supervisor.host.handover import FirstLaunch, Handover, report_ready
from dflashd.supervisor.host.home import (
    AlreadyRunning,
    Home,
    HomeError,
    HomeLock,
    already_running_message,
)
from dflashd.supervisor.model.exitcodes import EXIT_ALREADY_RUNNING, EXIT_USAGE
from dflashd.supervisor.speak.daemonlog import DaemonLog, is_daemon_log
from dflashd.supervisor.speak.diagnostics import configure_logging
from dflashd.supervisor.speak.echo import Echo, escape_controls
from dflashd.supervisor.speak.invocation import save_invocation
from dflashd.supervisor.speak.registry import remember
from dflashd.supervisor.watch.gpuwatch import SamplerFactory


class Serving(Protocol):
    def serve(self) -> int: ...


class DaemonMaker(Protocol):
    def __call__(
        self,
        home: Home,
        config: Config,
        *,
        doubles: HostDoubles | None = None,
        on_first_launch: FirstLaunch | None = None,
    ) -> Serving: ...


def serve_handed_over(
    handover: Handover, make: DaemonMaker, sampler_factory: SamplerFactory | None = None
) -> int:
    """The daemon serving the checked start until it ends; its exit code.  The home's lock is
    taken first (a refused start records nothing and says one line), held throughout and
    dropped at the end; then the invocation ``restart`` repeats is saved and the home
    remembered for ``ls``.  ``sampler_factory``: a test's GPUs (``tests/scripted_daemon.py``);
    None: NVML."""
    home, config, ready_fd = handover.home, handover.config, handover.ready_fd
    lock = HomeLock(home.lock)
    try:
        lock.acquire()
    except (AlreadyRunning, HomeError) as exc:
        running = isinstance(exc, AlreadyRunning)
        message = already_running_message(home) if running else str(exc)
        code = EXIT_ALREADY_RUNNING if running else EXIT_USAGE
        report_ready(ready_fd, {"ok": False, "error": message, "code": code})
        say(escape_controls(message))
        return code
    if handover.saved is not None:
        save_invocation(home, *handover.saved)
    remember(home.root)  # `ls` lists it from now on, whatever becomes of this daemon
    if handover.warning is not None:
        say(handover.warning)
    configure_logging(foreground=ready_fd is None)
    if ready_fd is not None and is_daemon_log(2, home.daemon_log):  # detached: bound daemon.log
        logs = config.logs
        configure_logging(
            stream=DaemonLog(home.daemon_log, logs.daemon_max_bytes, logs.daemon_backups)
        )
    printer = None
    if handover.echo and ready_fd is None and sys.stdout is not None:
        printer = Echo(
            sys.stdout.buffer, raw=handover.raw, color=handover.color, redraw=handover.redraw
        )

    def first_launch(info: dict[str, Any]) -> None:
        if ready_fd is not None:
            report_ready(ready_fd, info)
        elif info.get("ok"):  # the launch itself is the daemon's `launched` line, once
            say(f"r{info['run']} dflashd | log {info['log']}   (dflashd tail -f)", prefix="")
        else:
            say(f"run {info.get('run')}: {info.get('error')}")
            if info.get("log"):
                say(f"log: {info.get('log')}", prefix="")

    try:
        tap = printer.offer if printer is not None else None
        doubles = HostDoubles(sampler_factory=sampler_factory, line_tap=tap)
        return make(home, config, doubles=doubles, on_first_launch=first_launch).serve()
    except (LogWriterError, StartupError, OSError) as exc:
        message = str(exc) if not isinstance(exc, OSError) else f"{exc.strerror}: {exc.filename}"
        report_ready(ready_fd, {"ok": False, "error": message, "code": EXIT_USAGE})
        say(escape_controls(message))
        return EXIT_USAGE
    finally:
        if printer is not None:
            printer.close()
        lock.release()


def say(line: str, *, prefix: str = "dflashd: ") -> None:
    """One line on stderr; never raises (a closed terminal must not end the daemon)."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        sys.stderr.write(f"{prefix}{line}\n")
        sys.stderr.flush()
