"""What a dead run leaves behind: its observations, its facts, and the ledger kept between runs.

The :class:`Ledger` holds the counters that outlive a run (restart budgets, restarts by
verdict, the last exit, the fatal reason, whether the next launch clears the caches).
:meth:`Ledger.book` runs the pure :func:`~dflashd.supervisor.ending.conclude` and books its
outcome; the daemon then carries out the side effects (records, alerts, state) in one place.
"""

from __future__ import annotations

import os
import random
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dflashd.supervisor.clock import Clock
from dflashd.supervisor.config import Config
from dflashd.supervisor.custody import RunCustody, end_adopted
from dflashd.supervisor.ending import Outcome, RunFacts, conclude
from dflashd.supervisor.events import Event
from dflashd.supervisor.groups import ProcessOps
from dflashd.supervisor.home import Home
from dflashd.supervisor.lifecycle import Phase
from dflashd.supervisor.observe import RunObserver
from dflashd.supervisor.policy import RestartHistory
from dflashd.supervisor.recovery import previous_child
from dflashd.supervisor.reporting import Reporter
from dflashd.supervisor.run import Run
from dflashd.supervisor.verdicts import EndedBy, Observations, Verdict

CPU_LIFE_SHARE = 0.1  # a run that used at least this share of a CPU over its life was alive


def lived_s(run: Run, duration_s: float, cpu_s: float | None) -> float:
    """From the launch to the last sign of life: output, notify or GPU activity; the whole
    duration when the run kept a tenth of a CPU busy over it (a silent CPU-bound job)."""
    progress = run.progress
    last = max(
        progress.last_alive_mono or run.started_mono,
        progress.last_progress_mono or run.started_mono,
    )
    lived = max(0.0, last - run.started_mono)
    if cpu_s is not None and duration_s > 0 and cpu_s >= CPU_LIFE_SHARE * duration_s:
        lived = duration_s
    return lived


def observations(
    run: Run,
    status: int | None,
    stderr_tail: tuple[str, ...],
    duration_s: float = 0.0,
    cpu_s: float | None = None,
) -> Observations:
    """What the classifier may look at, from a reaped run and its wait status (None: unknown)."""
    return Observations(
        exit_code=os.WEXITSTATUS(status) if status is not None and os.WIFEXITED(status) else None,
        signal=os.WTERMSIG(status) if status is not None and os.WIFSIGNALED(status) else None,
        ended_by=run.ended_by,
        reached_first_step=run.progress.reached_first_step,
        output_lines=sum(d.line_count for d in run.drains),
        stderr_tail=stderr_tail,
        gpu_xids=tuple(run.gpu_xids),
        status_unknown=status is None,
        oom_kills=run.custody.oom_kills() if run.custody is not None else 0,
        lived_s=lived_s(run, duration_s, cpu_s),
    )


def run_facts(
    run: Run, obs: Observations, duration_s: float, tail: tuple[str, ...], stop_requested: bool
) -> RunFacts:
    """Everything :func:`conclude` needs about an ended run."""
    first = run.progress.first_step_mono
    last = run.progress.last_progress_mono or first
    return RunFacts(
        run.run_no,
        obs,
        duration_s,
        first_step_after_s=None if first is None else first - run.started_mono,
        # no step seen: the time it was alive stands for progress (a long run resets budgets)
        progress_s=obs.lived_s if first is None or last is None else last - first,
        step=run.progress.step,
        epoch=run.progress.epoch,
        tail=tail,
        already_alerted=frozenset(run.alerted),
        stop_requested=stop_requested,
    )


def ended_fields(fields: dict[str, Any]) -> dict[str, Any]:
    """The runs.sqlite columns of an ``exit`` record."""
    return {
        "verdict": fields["verdict"],
        "reason": fields["reason"],
        "exit_code": fields["exit_code"],
        "signal": fields["signal"],
        "first_step_s": fields.get("first_step_after_s"),
        "last_step": fields.get("step"),
    }


STATE_TAIL_LINES = 20
STATE_LINE_CHARS = 1000  # status and state.json carry a bounded tail; the exit record the full one


def capped_exit(fields: dict[str, Any]) -> dict[str, Any]:
    """An exit's fields as status and state.json carry them: the tail bounded.

    A job that dies printing 64 KiB lines of control bytes would otherwise make state.json
    grow past what its reader accepts (each byte escaped to six), and a later daemon would
    lose the run's record.  The ``exit`` record in the log keeps the whole tail.
    """
    tail = fields.get("tail")
    if isinstance(tail, list):
        cut = [
            line if len(line) <= STATE_LINE_CHARS else line[:STATE_LINE_CHARS] + "…"
            for line in (str(x) for x in tail[-STATE_TAIL_LINES:])
        ]
        fields = {**fields, "tail": cut}
    return fields


@dataclass
class Ledger:
    """The counters kept between runs."""

    history: RestartHistory = field(default_factory=RestartHistory)
    restarts_by_verdict: dict[str, int] = field(default_factory=dict)
    restarts_this_daemon: int = 0
    last_exit: dict[str, Any] | None = None
    fatal_reason: str | None = None
    clear_cache_next: bool = False
    agent_restarts: int = 0  # torchrun restarted its workers itself (this daemon's lifetime)
    agent_worker_failures: int = 0

    def book(
        self,
        facts: RunFacts,
        config: Config,
        *,
        jitter: float,
        ended_at: float,
    ) -> Outcome:
        """Decide what follows the run and record it here."""
        outcome = conclude(
            facts,
            history=self.history,
            policy=config.restart,
            alerts_on=config.alerts.on,
            jitter=jitter,
        )
        self.last_exit = capped_exit(
            {"run": facts.run_no, "ended_at": ended_at, **outcome.exit_fields}
        )
        self.history = outcome.decision.history
        if outcome.counts_as_restart:
            verdict = outcome.result.verdict.value
            self.restarts_by_verdict[verdict] = self.restarts_by_verdict.get(verdict, 0) + 1
            self.restarts_this_daemon += 1
        self.clear_cache_next = outcome.clear_cache
        self.fatal_reason = outcome.fatal_reason
        return outcome


# The child's last words are already in the pipes: framing them is quick, unless the log's
# disk pushes back; the sink drops after 2 s of a stalled write, so this bound is never hit
# by a healthy disk, and the exit record still follows every byte caught up.
CATCH_UP_S = 5.0
DUMP_GRACE_S = 3.0  # between SIGABRT (stack dump) and SIGKILL
LEFTOVER_GRACE_S = 3.0  # a dead run's leftovers: between SIGTERM and SIGKILL, before a relaunch
LEFTOVER_POLL_S = 0.1
LEFTOVER_GIVE_UP_S = 10.0  # SIGKILLed 7 s ago and still there: relaunch anyway


class Aftermath:
    """Ending runs and carrying out what their ends mean: records, history, alerts, leftovers."""

    def __init__(
        self,
        config: Config,
        clock: Clock,
        ops: ProcessOps,
        reporter: Reporter,
        observer: RunObserver,
        ledger: Ledger,
    ) -> None:
        self.config, self.clock, self.ops = config, clock, ops
        self.reporter, self.observer, self.ledger = reporter, observer, ledger
        self.ended: list[RunCustody] = []  # ended runs whose processes outlived them
        self._leftovers_since: float | None = None
        self.on_empty: Callable[[int], None] | None = None  # posts RunEmptied to the loop
        self._rng = random.Random()

    def restore(self, previous: dict[str, Any], home: Home, boot: str | None) -> None:
        """Start-up: carry the counters over from state.json, end what a dead daemon left (proven ours)."""
        self.ledger.restarts_by_verdict = dict(previous.get("restarts_by_verdict") or {})
        if previous.get("state") == "fatal":
            self.observer.recovering_from = "fatal"
        timeout = self.config.restart.stop_timeout_s
        for event, run_no, fields in self.ops.recover(previous, boot, timeout):
            self.reporter.announce(run_no, Event(event), "warning", **fields)
        self._close_lost_run(previous)
        writer = self.reporter.writer
        if writer.torn_bytes:
            self.reporter.event(writer.last_run, Event.LOG_TORN_TAIL, bytes=writer.torn_bytes)

    def end_leftovers(self, run: Run | None, now: float) -> float | None:
        """Before a relaunch, end what the dead run left running; None once nothing is left.

        What is left is what the run's custody proves its own: its cgroup's processes, or
        the pidfd-proven members (its group while the child was unreaped, descendants of
        proven members, and processes carrying this home's id and the run's number: a
        torchrun agent's workers run in sessions of their own).  SIGTERM, then SIGKILL
        (``cgroup.kill``) after ``LEFTOVER_GRACE_S``.  Returns when to look again meanwhile.
        """
        custody = run.custody if run is not None and not run.alive else None
        pids = custody.members() if custody is not None else set()
        if not pids or run is None or custody is None:
            self._leftovers_since = None
            self._forget_empty()
            return None
        if self._leftovers_since is None:
            self._leftovers_since = now
            named = {str(pid): self.ops.cmdline(pid) for pid in sorted(pids)}
            self.reporter.announce(
                run.run_no,
                Event.ENDING_LEFTOVERS,
                "warning",
                pids=named,
                signal="SIGTERM",
                by=custody.mode,
            )
            custody.signal_all(signal.SIGTERM)
            custody.signal_all(signal.SIGCONT)
            self._watch_until_empty(custody, run.run_no)
            return now + LEFTOVER_GRACE_S  # unless the watcher says "empty" first
        elif now - self._leftovers_since >= LEFTOVER_GIVE_UP_S:
            # Unkillable (stuck in the kernel, say): say so, and launch anyway.
            self.reporter.event(run.run_no, Event.LEFTOVER_PROCESSES, pids=sorted(pids))
            self._leftovers_since = None
            return None
        elif now - self._leftovers_since >= LEFTOVER_GRACE_S:
            custody.kill_all()
            return self._leftovers_since + LEFTOVER_GIVE_UP_S
        return now + LEFTOVER_POLL_S

    def _watch_until_empty(self, custody: RunCustody, run_no: int) -> None:
        """A thread waits for the run to empty (``cgroup.events``, or pidfds turning readable)
        and wakes the loop: the relaunch follows the last leftover at once, not a poll."""
        notify = self.on_empty
        if notify is None:
            return

        def watch() -> None:
            if custody.wait_empty(LEFTOVER_GIVE_UP_S + 1.0):
                notify(run_no)

        threading.Thread(target=watch, name=f"dflashd-empty-{run_no}", daemon=True).start()

    def _forget_empty(self) -> None:
        """Ended runs with nothing left: close their custody (pidfds, cgroups)."""
        keep: list[RunCustody] = []
        for custody in self.ended:
            if custody.empty():
                custody.close()
            else:
                keep.append(custody)
        self.ended = keep

    def sweep(self, run: Run | None, *, own_descendants: bool) -> None:
        """Shutdown: every run's processes end with us, proven ones only, until none is left."""
        custodies = list(self.ended)
        if run is not None and run.custody is not None and run.custody not in custodies:
            custodies.append(run.custody)
        for custody in custodies:
            if not custody.empty():
                custody.signal_all(signal.SIGTERM)
                custody.signal_all(signal.SIGCONT)
                if not custody.wait_empty(2.0):
                    custody.kill_all()
                    custody.wait_empty(5.0)
        for custody in custodies:
            custody.close()
        self.ended = []
        if own_descendants:
            end_adopted(exclude=self.reporter.alerts.pids)

    def _close_lost_run(self, previous: dict[str, Any]) -> None:
        """The previous daemon was killed while its run lived: that run gets its exit record now."""
        child = previous_child(previous)
        last_exit = previous.get("last_exit") or {}
        if child is None or last_exit.get("run") == child.run_no:
            return
        if previous.get("state") not in ("starting", "running", "stopping"):
            return
        step = previous.get("step") if isinstance(previous.get("step"), int) else None
        fields: dict[str, Any] = {
            "exit_code": None,
            "signal": None,
            "duration_s": None,
            "verdict": Verdict.LOST.value,
            "reason": "daemon_killed",
            "tail": [],
            "step": step,
            "output_lines": None,
            "note": "the daemon died while this run lived: its end was not seen",
        }
        self.reporter.event(child.run_no, Event.EXIT, **fields)
        ended_at = self.clock.time()
        self.ledger.last_exit = {"run": child.run_no, "ended_at": ended_at, **fields}
        self.reporter.record_history(
            lambda db: db.ended(child.run_no, ended_at=ended_at, **ended_fields(fields))
        )

    def stop_run(self, run: Run, timeout_s: float) -> None:
        """``dflashd stop``: SIGTERM to the run's group (and SIGCONT, should it be stopped)."""
        custody = run.custody
        if custody is None:
            return
        if not run.ended_by_us:
            run.ended_by = EndedBy.STOP
        self.reporter.event(run.run_no, Event.STOPPING, signal="SIGTERM", timeout_s=timeout_s)
        custody.signal_group(signal.SIGTERM)
        custody.signal_group(signal.SIGCONT)

    def end_run(self, run: Run, why: EndedBy) -> None:
        """We end the run (stall, no GPU memory): ask for a stack dump, then kill the group."""
        custody = run.custody
        if custody is None or not run.alive or run.ended_by_us:
            return
        run.ended_by = why
        self.reporter.announce(
            run.run_no, Event.ENDING_RUN, "warning", why=why.value, signal="SIGABRT", then="SIGKILL"
        )
        # PYTHONFAULTHANDLER=1 makes a Python child print every thread's stack on SIGABRT;
        # SIGCONT after it, so a stopped (SIGSTOPped) child wakes up to take it.
        custody.signal_root(signal.SIGABRT)
        custody.signal_group(signal.SIGCONT)
        run.kill_at_mono = self.clock.monotonic() + DUMP_GRACE_S

    def catch_up(self, run: Run) -> None:
        """The child is dead: everything it wrote is in the pipes; frame it before the verdict."""
        for drain in run.drains:
            drain.catch_up(CATCH_UP_S)

    def child_died(self, run: Run, status: int | None, stop_requested: bool) -> Outcome:
        """The child was reaped (``status`` None: gone, status unknown): conclude, then sweep its group."""
        died = self.clock.monotonic()
        run.phase = Phase.EXITED
        if run.launched is not None and run.launched.process is not None:
            code = -1 if status is None else os.waitstatus_to_exitcode(status)
            run.launched.process.returncode = code
        if run.progress.unrecorded:
            self.observer.progress_record(run)  # the curve ends where the run did
        tails = {d.src: tuple(d.tail) for d in run.drains}
        duration = died - run.started_mono
        cpu_s = self.ops.reaped_cpu_s(run.pid) if run.pid is not None else None
        if run.custody is not None and run.custody.mode == "cgroup":
            whole = run.custody.cpu_time_s()  # the whole run's, workers in new sessions included
            cpu_s = max(cpu_s or 0.0, whole) if whole is not None else cpu_s
        obs = observations(run, status, tails.get("stderr", ()), duration, cpu_s)
        tail = tails.get("stderr") or tails.get("stdout") or ()
        custody = run.custody
        if custody is not None:
            custody.reaped(cpu_s)  # its pid proves nothing from now on
        outcome = self.conclude(run, obs, duration, tail, stop_requested)
        if custody is not None:
            if run.ended_by_us:
                custody.kill_all()  # ended by us: nothing of it lives on
            elif leftovers := sorted(custody.members()):
                event = Event.LEFTOVER_PROCESSES
                self.reporter.event(run.run_no, event, pgid=run.pid, pids=leftovers)
            # Only runs that may still have processes: a crash loop must not grow this list.
            self._forget_empty()
            self.ended.append(custody)
        return outcome

    def conclude(
        self,
        run: Run,
        obs: Observations,
        duration_s: float,
        tail: tuple[str, ...],
        stop_requested: bool,
    ) -> Outcome:
        """Classify, decide and book the run's end, then write what it means: exit first."""
        facts = run_facts(run, obs, duration_s, tail, stop_requested)
        ended_at = self.clock.time()
        outcome = self.ledger.book(facts, self.config, jitter=self._rng.random(), ended_at=ended_at)
        fields, result = outcome.exit_fields, outcome.result
        level = "info" if result.verdict.value in ("completed", "stopped") else "error"
        self.reporter.event_on_disk(run.run_no, Event.EXIT, fields, 0.1, level)
        self.reporter.record_history(
            lambda db: db.ended(run.run_no, ended_at=ended_at, **ended_fields(fields))
        )
        for kind, why in outcome.alerts:
            self.reporter.alert(run, kind, why, fields, list(self.observer.gpu.last))
        if outcome.recovering_from is not None:
            self.observer.recovering_from = outcome.recovering_from
        for event, extra in outcome.records:
            level = "error" if event is Event.FATAL else "info"
            self.reporter.announce(run.run_no, event, level, **extra)
        return outcome
