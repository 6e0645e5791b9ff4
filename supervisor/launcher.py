"""Launching one run: the log before the fork, the fork itself, the pipes after it.

:meth:`Launcher.launch` makes a :class:`Run`, clears the owned caches when the last outcome
asked for it, writes ``spawn`` (waited onto disk, so the log says what was attempted even if
the child never runs an instruction), forks through the process seam, writes ``launched``
and starts one drain per pipe.  A failed exec comes back as the run's ``spawn_error``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, Final

from dflashd.logs.drain import PipeDrain
from dflashd.supervisor import __version__
from dflashd.supervisor.host.caches import clear_owned_cache, extensions_root, prepare_caches
from dflashd.supervisor.host.clock import Clock
from dflashd.supervisor.host.config import Config
from dflashd.supervisor.host.home import Home
from dflashd.supervisor.host.processops import ProcessOps
from dflashd.supervisor.host.proof import SpawnedChild
from dflashd.supervisor.host.spawn import (
    FLIGHT_FILE,
    LIVE_BARS_ENV,
    ChildEnvironment,
    child_environ,
    dflashd_env,
    flight_recorder_env,
)
from dflashd.supervisor.host.standby import (
    GO_SIGNAL,
    Standby,
    learnt_imports,
    python_job,
    standby_argv,
    unusable_because,
)
from dflashd.supervisor.model.agent import AgentView
from dflashd.supervisor.model.events import Event
from dflashd.supervisor.model.progress import Progress
from dflashd.supervisor.model.runstate import RunState
from dflashd.supervisor.speak.diagnostics import bind_run, get_logger
from dflashd.supervisor.speak.recorder import Recorder
from dflashd.supervisor.speak.statusview import read_state
from dflashd.supervisor.watch.elastic import scan_frame, torchrun_job
from dflashd.supervisor.watch.gpuwatch import GpuWatch
from dflashd.supervisor.watch.linewatch import LineWatcher
from dflashd.supervisor.watch.placement import placement
from dflashd.supervisor.watch.run import FactsBook, Run

log = get_logger("dflashd")

TAIL_LINES: Final = 20
SPAWN_ON_DISK_S: Final = 2.0


def spawn_error_text(argv0: str, exc: OSError) -> str:
    """``No such file or directory: /opt/x/python`` (the file the OS could not exec)."""
    if isinstance(exc, FileNotFoundError) and exc.filename and str(exc.filename) != argv0:
        return f"{exc.strerror}: {exc.filename}"
    return f"{exc.strerror or exc}: {argv0}"


TRANSIENT_ERRNOS: Final = (errno.EMFILE, errno.ENFILE, errno.EAGAIN, errno.ENOMEM)


class LaunchDeferred(Exception):
    """The launch failed for want of a resource the host gives back (descriptors, memory)."""

    def __init__(self, run_no: int, error: str) -> None:
        super().__init__(error)
        self.run_no, self.error = run_no, error


class Launcher:
    """Turns the config into running children, one run at a time."""

    def __init__(
        self,
        home: Home,
        config: Config,
        clock: Clock,
        ops: ProcessOps,
        reporter: Recorder,
        gpu: GpuWatch,
        on_lines: Callable[[int], LineWatcher],
    ) -> None:
        self.home, self.config, self.clock, self.ops = home, config, clock, ops
        self.reporter, self.gpu, self._on_lines = reporter, gpu, on_lines
        self.standby: Standby | None = None  # the next run's interpreter, waiting (warm_standby)
        self.left_run = 0  # the run the last daemon's state.json named, read before it is rewritten
        # a pattern is configured: first_step_timeout_s applies
        self.sees_steps = bool(config.first_step_pattern or config.step_pattern)

    def next_run_no(self, current: Run | None) -> int:
        """One more than any run this home has seen: the log, runs.sqlite, state.json, memory."""
        previous = read_state(self.home.state_file) or {}
        known = [self.reporter.last_run_seen(), current.run_no if current else 0, self.left_run]
        known.append(int(previous.get("run") or 0))
        return max(known) + 1

    def launch(
        self,
        previous: Run | None,
        book: FactsBook,
        *,
        clear_cache: bool,
        run_no: int | None = None,
        best_before: int | None = None,
        downtime_s: float | None = None,
        visible_gpus: tuple[int, ...] | None = None,
    ) -> tuple[Run, RunState, str | None]:
        """Start the next run (or ``run_no`` again); the run's handles (``book`` keeps its
        facts), what is known of it, and the exec error when it could not start.  Raises :class:`LaunchDeferred` when the host is out of descriptors or
        memory before the fork: no verdict, the daemon retries.  ``best_before``: the best
        step of the earlier runs (steps up to it are redone); ``downtime_s``: since the last
        run's death, for the ``spawn`` record (goodput)."""
        run_no = run_no or self.next_run_no(previous)
        self.gpu.new_run()
        now = self.clock.monotonic()
        cwd = Path(self.config.cwd).expanduser()
        spec = self._spec(run_no)
        job = torchrun_job(self.config.command)
        # a node of a larger job (job is not None): its agent's rendezvous is warm-up
        progress = Progress(
            now, self.sees_steps, best_before=best_before, rendezvous=job is not None
        )
        argv = tuple(self.config.command)
        facts = RunState(run_no, argv, now, self.clock.time(), progress)
        agent = AgentView(job, rendezvous_since=now) if job is not None else None
        facts = replace(facts, gpu_baseline_mib=self.gpu.baseline(), agent=agent)
        if clear_cache:
            self._clear_cache(run_no)
        else:
            prepare_caches(self.home.cache, self.home.id)
        spawn_fields: dict[str, Any] = {
            "argv": list(argv),
            "cwd": str(cwd),
            "env_keys": sorted(dflashd_env(spec)),
            "config_env_keys": sorted(self.config.env),
            "dflashd_version": __version__,
        }
        if downtime_s is not None:
            spawn_fields["downtime_s"] = round(downtime_s, 3)
        if visible_gpus is not None:
            spawn_fields["cuda_visible_devices"] = list(visible_gpus)
        if job is not None:
            spawn_fields["torchrun"] = job.fields()
        if (placed := placement(os.environ, argv).fields()) is not None:
            spawn_fields["placement"] = placed  # Slurm's job, step and node id, or torchrun's
        env = self._environment(run_no, visible_gpus)
        warm, cold_because = self._take_standby(run_no, argv, cwd, env)
        spawn_fields["start"] = "cold" if warm is None else "warm"
        facts = replace(facts, start=spawn_fields["start"])
        if cold_because is not None:  # a standby was there and could not be used: said once
            spawn_fields["cold_because"] = cold_because
        self.reporter.record(run_no, Event.SPAWN, wait_s=SPAWN_ON_DISK_S, **spawn_fields)
        argv_text = " ".join(argv)
        flight = Path(env[FLIGHT_FILE])  # ours, or where the user's setting puts them
        facts = replace(facts, flight_prefix=flight, extensions_root=extensions_root(env))
        with contextlib.suppress(OSError):
            flight.parent.mkdir(parents=True, exist_ok=True)
        started_wall = facts.started_wall
        try:
            launched = self._go_or_spawn(warm, run_no, argv, cwd, env)
        except OSError as exc:
            if exc.errno in TRANSIENT_ERRNOS and not isinstance(exc, FileNotFoundError):
                raise LaunchDeferred(
                    run_no, f"{errno.errorcode.get(exc.errno or 0)}: {exc.strerror}"
                ) from None
            error = spawn_error_text(argv[0], exc)
            log.error("spawn_failed", run=run_no, error=error)
            self.reporter.record_history(
                lambda db: db.started(run_no, started_wall, None, argv_text)
            )
            return Run(run_no, book), replace(facts, spawn_error=error), error
        create_time, ticks = self.ops.create_time(launched.pid), self.ops.start_ticks(launched.pid)
        facts = replace(facts, create_time=create_time, start_ticks=ticks).saw({launched.pid})
        bind_run(run=run_no, pid=launched.pid)
        custody = launched.custody
        self.reporter.record(
            run_no,
            Event.LAUNCHED,
            log_level="info",
            pid=launched.pid,
            pgid=launched.pid,
            custody=custody.mode if custody is not None else None,
        )
        callback = self._on_lines(run_no)
        if agent is not None:
            callback.agent_scan = scan_frame
        drains = tuple(
            PipeDrain(
                fd,
                run=run_no,
                src=src,
                sink=self.reporter.frames,
                max_line_bytes=self.config.logs.max_line_bytes,
                tail_lines=TAIL_LINES,
                on_lines=callback,
            )
            for fd, src in ((launched.stdout_fd, "stdout"), (launched.stderr_fd, "stderr"))
        )
        self.reporter.record_history(
            lambda db: db.started(run_no, started_wall, launched.pid, argv_text)
        )
        run = Run(run_no, book, launched, drains, callback)
        return run, facts, None

    def _spec(self, run_no: int) -> ChildEnvironment:
        return ChildEnvironment(
            self.home.notify_socket, self.home.cache, run_no, self.home.root, self.home.id
        )

    def _environment(self, run_no: int, visible_gpus: tuple[int, ...] | None) -> dict[str, str]:
        """Run ``run_no``'s environment: the same for its cold launch and its standby."""
        defaults = dict(LIVE_BARS_ENV) if self.config.builtin_formats else {}
        defaults.update(flight_recorder_env(self.home.logs / "flight" / f"run-{run_no}-rank"))
        env = child_environ(os.environ, self.config.env, self._spec(run_no), defaults)
        if visible_gpus is not None:  # a GPU left out by the pre-flight (model/preflight.py)
            # NVML's indices, in NVML's (PCI bus) order
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in visible_gpus)
            env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        return env

    # -- the warm standby (host/standby.py) ---------------------------------------------------

    def prepare_standby(self, current: Run) -> None:
        """The run trains: start the next run's interpreter (``warm_standby``, a python job)."""
        job = python_job(tuple(self.config.command))
        if not self.config.warm_standby or self.standby is not None or job is None:
            return
        if current.launched is None:
            return
        run_no = current.run_no + 1
        cwd = Path(self.config.cwd).expanduser()
        env = self._environment(run_no, None)
        manifest = self.home.root / f".standby-run-{run_no}.json"
        with contextlib.suppress(OSError):
            manifest.unlink()
        imports = learnt_imports(current.launched.pid)
        try:
            launched = self.ops.spawn(
                standby_argv(job, manifest, imports), cwd=cwd, env=env, run_no=run_no
            )
        except OSError as exc:
            why = spawn_error_text(job.python, exc)
            self.reporter.record(current.run_no, Event.STANDBY, for_run=run_no, error=why)
            return
        argv = tuple(self.config.command)
        self.standby = Standby(run_no, launched, argv, cwd, env, manifest)
        self.reporter.record(
            current.run_no, Event.STANDBY, for_run=run_no, pid=launched.pid, imports=imports
        )

    def _take_standby(
        self, run_no: int, argv: tuple[str, ...], cwd: Path, env: dict[str, str]
    ) -> tuple[Standby | None, str | None]:
        """The standby, when it may become this launch; else it is ended, and why."""
        standby, self.standby = self.standby, None
        if standby is None:
            return None, None
        why = (
            f"the standby was started for run {standby.run_no}"
            if standby.run_no != run_no
            else unusable_because(standby, argv, cwd, env)
        )
        if why is None:
            return standby, None
        self._end_standby(standby)
        return None, why

    def _go_or_spawn(
        self,
        warm: Standby | None,
        run_no: int,
        argv: tuple[str, ...],
        cwd: Path,
        env: dict[str, str],
    ) -> SpawnedChild:
        """The standby told to run the job (the spawn record is on disk), else a cold spawn."""
        if warm is not None:
            try:
                return self._go(warm)
            except OSError:  # it died between the check and the go: cold after all, said so
                self._end_standby(warm)
                self.reporter.record(run_no, Event.STANDBY, died_at_go=True, launched="cold")
        return self.ops.spawn(argv, cwd=cwd, env=env, run_no=run_no)

    @staticmethod
    def _go(standby: Standby) -> SpawnedChild:
        """The standby becomes the launch: told to run the job (its custody, its pipes)."""
        custody = standby.launched.custody
        if custody is None or not custody.signal_root(GO_SIGNAL):
            raise ProcessLookupError(errno.ESRCH, "the standby is gone")
        with contextlib.suppress(OSError):
            standby.manifest.unlink()
        return standby.launched

    @staticmethod
    def _end_standby(standby: Standby) -> None:
        """End a standby that will not be used (everything in its custody), its manifest gone."""
        custody = standby.launched.custody
        if custody is not None:
            custody.kill_all()
        process = standby.launched.process
        if process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired, ChildProcessError):
                process.wait(5.0)
        for fd in (standby.launched.stdout_fd, standby.launched.stderr_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
        with contextlib.suppress(OSError):
            standby.manifest.unlink()

    def discard_standby(self) -> None:
        """The daemon ends: a waiting standby goes with it."""
        standby, self.standby = self.standby, None
        if standby is not None:
            self._end_standby(standby)

    def standby_view(self) -> dict[str, Any] | None:
        """``status``'s ``standby`` (None: none is waiting)."""
        return self.standby.view() if self.standby is not None else None

    def _clear_cache(self, run_no: int) -> None:
        # Only the directories dflashd made and marked (caches.py): never the user's own.
        clearing = clear_owned_cache(self.home.cache, self.home.id)
        self.reporter.record(
            run_no,
            Event.CACHE_CLEARED,
            path=str(self.home.cache),
            cleared=bool(clearing.cleared),
            caches=clearing.cleared,
            kept=clearing.kept,
        )
