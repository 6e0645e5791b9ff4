"""Ending a live run: the one module that carries out dflashd's end of a run that has not died.

Four ways, each decided in the model and carried out here: ``dflashd stop`` (SIGTERM to the
job's group, SIGKILL past ``stop_timeout_s``), a proven hang (``step``'s ``HangLook`` arm, from
sampled stacks: :class:`~dflashd.supervisor.model.effects.EndRunHung`), a stall (the progress
deadline passed; this module looks at the host, ``step``'s ``StallLook`` arm decides) and no
GPU memory past its grace (``step``'s ``GpuSeen`` arm); the last two, and a diverged loss, come
as :class:`~dflashd.supervisor.model.effects.EndRun`.  Before every kill dflashd decided, it
dumps the run's stacks with py-spy (the job keeps running meanwhile) and waits for the dump up
to ``STACKS_BOUND_S``; where py-spy is missing or fails, it asks faulthandler for a dump
instead (SIGABRT: ``PYTHONFAULTHANDLER=1``) and kills after ``DUMP_GRACE_S``.  The run's death
then takes the usual walk (reap -> conclude -> apply), with the run's facts saying who ended
it (``ended_by``) and where the dump is (``stacks``).
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any, Final

from dflashd.supervisor.host.caches import file_age, stale_build_locks
from dflashd.supervisor.host.clock import Clock
from dflashd.supervisor.model.deadlines import Deadline, Deadlines
from dflashd.supervisor.model.effects import (
    DumpStacks,
    Effect,
    EndRunHung,
    KeepStacks,
    KillRun,
    SetTimer,
    SignalRun,
    WriteRecord,
)
from dflashd.supervisor.model.events import Event
from dflashd.supervisor.model.hang import HangLimits, HangSampled, HangView, HangWatch
from dflashd.supervisor.model.inputs import HangLook, Input, Observed, StartupView
from dflashd.supervisor.model.judge import SAMPLES, Sample
from dflashd.supervisor.model.progress import Limits
from dflashd.supervisor.model.stacks import StacksDump, StacksTaken, alert_lines
from dflashd.supervisor.model.verdicts import EndedBy
from dflashd.supervisor.watch.observe import Apply, RunObserver
from dflashd.supervisor.watch.pacewatch import straggler
from dflashd.supervisor.watch.run import Run
from dflashd.supervisor.watch.stackdumps import STACKS_BOUND_S, Dumper
from dflashd.supervisor.watch.worldshare import node_rank, world_share

DUMP_GRACE_S: Final = 3.0  # between SIGABRT (faulthandler's dump) and SIGKILL


class LiveRunControl:
    """Stop, dump, end and kill the live run, each at its deadline."""

    def __init__(
        self,
        clock: Clock,
        observer: RunObserver,
        limits: Limits,
        dumps: Dumper,
        deadlines: Callable[[], Deadlines],
        hang: Callable[[], HangWatch],
        look: Callable[[Run, Input], object],
    ) -> None:
        self.clock, self.observer = clock, observer
        self.limits, self.dumps = limits, dumps
        # the daemon's deadline table and the run's hang watch (the model keeps both), and the
        # way to hand the model what this module knows of the live run (an input)
        self.deadlines, self.hang, self.look = deadlines, hang, look

    def _act(self, run: Run | None, *effects: Effect, publish: bool = False) -> None:
        """What this module decided, handed to the model and the one executor: it never writes
        a record, signals, dumps or alerts itself."""
        self.observer.apply(run, effects, publish=publish)

    def stop(self, run: Run, timeout_s: float) -> None:
        """``dflashd stop``: SIGTERM to the run's group (and SIGCONT, should it be stopped)."""
        if run.custody is None:
            return
        self._act(
            run,
            WriteRecord(Event.STOPPING, {"signal": "SIGTERM", "timeout_s": timeout_s}),
            SignalRun("group", signal.SIGTERM),
            SignalRun("group", signal.SIGCONT),  # should it be stopped
            SetTimer(Deadline.STOP, self.clock.monotonic() + timeout_s),
        )

    def end(self, run: Run, why: EndedBy) -> None:
        """The model ended the run (a stall, no GPU memory, a diverged loss): a dump, then the
        kill."""
        if run.custody is None or not run.alive:
            return
        self._dump_then_kill(run, why.value, Event.ENDING_RUN)

    def _dump_then_kill(self, run: Run, why: str, event: Event) -> None:
        if not self.dumps.available:
            self._faulthandler(run, why, event, self.dumps.tool())
            return
        dump_id = self.dumps.next_id(run)
        fields = {"why": why, "dump": "py-spy", "then": "SIGKILL", "bound_s": STACKS_BOUND_S}
        self._act(
            run,
            DumpStacks(why, dump_id, before_kill=True),
            WriteRecord(event, fields, log_level="warning"),
            SetTimer(Deadline.KILL, self.clock.monotonic() + STACKS_BOUND_S),  # the dump's bound
        )

    def _faulthandler(self, run: Run, why: str, event: Event, py_spy: str | None) -> None:
        """The fallback: faulthandler prints every thread's Python stack on SIGABRT."""
        custody = run.custody
        if custody is None:
            return
        fields: dict[str, Any] = {"why": why, "dump": "faulthandler", "signal": "SIGABRT"}
        fields |= {"then": "SIGKILL", "py_spy": py_spy}
        self._act(
            run,
            WriteRecord(event, fields, log_level="warning"),
            SignalRun("root", signal.SIGABRT),
            # SIGCONT after it, so a stopped (SIGSTOPped) child wakes up to take it.
            SignalRun("group", signal.SIGCONT),
            SetTimer(Deadline.KILL, self.clock.monotonic() + DUMP_GRACE_S),
        )

    def taken(self, run: Run | None, message: StacksTaken) -> None:
        """A dump finished: its record and file; a kill that waited for it goes ahead now."""
        fields, level = self.dumps.taken(message, self.clock.time())
        said = WriteRecord(Event.STACKS, fields, log_level=level, run_no=message.run_no)
        if message.dump.trigger == "slow" and run is not None and run.run_no == message.run_no:
            facts, found = straggler(run.facts, fields)  # the straggler, if any
            self.look(run, Observed(facts, (said, *found)))
            return
        ours = run is not None and run.run_no == message.run_no
        if run is None or not ours or run.facts.dump_before_kill != message.dump_id:
            self._act(run, said)
            return
        kept = KeepStacks(kept_stacks(fields))
        if not run.alive or run.custody is None:
            self._act(run, said, kept)
        elif message.dump.ok:
            self._act(run, said, kept, SetTimer(Deadline.KILL, None), KillRun())
        else:  # py-spy could not read the run (a seccomp profile, say): faulthandler's dump
            self._act(run, said, kept)
            self._faulthandler(run, message.dump.trigger, Event.ENDING_RUN, message.dump.error)

    # -- hangs: the evidence decides (hang.py), this applies ---------------------------------

    def _look(self, run: Run, now: float, sample: tuple[Sample, StacksDump] | None = None) -> None:
        """Hand the model what is known of the live run now (``sample``: one that just came
        back): it keeps the hang watch, decides, and says what follows."""
        watch = self.hang()
        facts = run.facts
        progress = facts.progress
        limits = HangLimits(self.limits.hang_suspect_s, self.limits.remote_wait_s)
        wall = self.clock.time()
        if not progress.reached_first_step:
            root = facts.extensions_root
            # looked for only when a round is complete and about to be judged (a glob per
            # wake-up of a chatty start-up would be waste)
            judged = root is not None and len(watch.samples) + bool(sample) >= SAMPLES
            locks = stale_build_locks(root, facts.started_wall) if judged and root else ()
            held = tuple((path, age) for path in locks if (age := file_age(path, wall)))
            start = StartupView(facts.started_mono, self.dumps.available, bool(locks), held)
            self.look(run, HangLook(None, start, limits, wall, sample=sample))
            return
        dump = sample[1] if sample is not None else watch.last_dump
        view = HangView(
            progress.last_progress_mono,
            progress.intervals,
            progress.reports_steps,
            self.dumps.available,
            gpu_idle=facts.gpu_seen == "idle",
            node=node_rank(run, dump),
            gpu_power_share=facts.gpu_power.share(),
            worker_rounds=len(progress.recoveries),
            longest_pause_s=max((*progress.intervals, *progress.pace.pauses), default=0.0),
            restarted_at=progress.recoveries[-1].failed if progress.recoveries else None,
            steps_seen=progress.steps_seen,
        )
        share = world_share(run, watch, now)
        self.look(run, HangLook(view, None, limits, wall, share, progress.step, sample))

    def hang_sampled(self, run: Run | None, message: HangSampled) -> None:
        """A sample came back: kept with the run's evidence, and the decider asked at once."""
        if run is None or run.run_no != message.run_no or not run.alive:
            return
        sample = (message.sample, message.dump)
        if run.facts.ended_by_us:  # kept, nothing more decided: the run is being ended
            limits = HangLimits(self.limits.hang_suspect_s, self.limits.remote_wait_s)
            self.look(run, HangLook(None, None, limits, self.clock.time(), sample=sample))
            return
        self._look(run, self.clock.monotonic(), sample)

    def end_hung(self, run: Run, hung: EndRunHung) -> None:
        """A proven hang (the model's verdict, its facts already say so): the sample that
        proved it is the run's dump (its file and record), and the kill follows at once (no
        second dump)."""
        if run.custody is None or not run.alive:
            return
        dump = self.hang().last_dump
        said: tuple[Effect, ...] = ()
        if dump is not None:
            dump.trigger = "hung"
            taken = StacksTaken(run.run_no, "hang", dump)
            fields, level = self.dumps.taken(taken, self.clock.time())
            said = (
                WriteRecord(Event.STACKS, fields, log_level=level),
                KeepStacks(kept_stacks(fields)),
            )
        ending: dict[str, Any] = {"why": EndedBy.HUNG.value, "evidence": hung.why}
        ending |= {"frames": list(hung.frames), "hung_after_s": hung.hung_after_s}
        ending |= {"dump": "py-spy", "then": "SIGKILL"}
        self._act(run, *said, WriteRecord(Event.ENDING_RUN, ending, log_level="warning"), KillRun())

    def check(self, run: Run | None, now: float) -> None:
        """The live run's deadlines: the kill after a dump, a hang, a stall (the model decides
        the hang and the stall from what this hands it: ``step``'s hang and stall arms)."""
        live = run is not None and run.alive and run.pid is not None
        if live and run is not None:
            if self.deadlines().is_due(Deadline.KILL, now):
                # a dump past its bound is not waited for any longer
                self._act(run, SetTimer(Deadline.KILL, None), KillRun())
            if not run.facts.ended_by_us:
                self._look(run, now)
            facts = run.facts
            stall = None if facts.ended_by_us else facts.progress.stall_deadline(self.limits)
            if stall is not None and now >= stall:
                looked = self.observer.stall_look(run, now)
                if looked is not None:
                    self.look(run, looked)

    def stop_timed_out(self, run: Run | None) -> None:
        """The stop's grace is over: the stacks (py-spy), then SIGKILL."""
        live = run is not None and run.alive and run.pid is not None
        if not live or run is None or run.facts.dump_before_kill is not None:
            return
        if self.dumps.available:
            self._dump_then_kill(run, "stop_timeout", Event.STOP_TIMEOUT)
        elif run.custody is not None:  # no py-spy: the stop's grace is over, no more waiting
            self._act(run, WriteRecord(Event.STOP_TIMEOUT, {"signal": "SIGKILL"}), KillRun())


def kept_stacks(fields: dict[str, Any]) -> dict[str, Any]:
    """What the run keeps of the dump taken before its kill: its file, the odd rank out, the
    top frames (the exit record and the alert say them)."""
    kept = ("dump_id", "path", "odd_rank_out", "odd_summary", "error")
    stacks = {k: fields[k] for k in kept if fields.get(k) is not None}
    return {**stacks, "top": alert_lines(fields)}


def stacks_command(
    dumps: Dumper, act: Apply, log_path: object, run: Run | None, request: dict[str, Any]
) -> dict[str, Any]:
    """``dflashd stacks``: start a dump of the live run (through the executor, ``act``); the
    client waits for its record."""
    if run is None or not run.alive:
        return {"ok": False, "error": "no live run to dump"}
    if not dumps.available:
        return {"ok": False, "error": dumps.tool()}
    dump_id = dumps.next_id(run)
    act(run, (DumpStacks("command", dump_id, native=bool(request.get("native"))),))
    return {
        "ok": True,
        "run": run.run_no,
        "dump_id": dump_id,
        "log": str(log_path),
    }
