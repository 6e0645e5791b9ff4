"""The live run, watched for its end: what the shell reads of it for the model's deciders.

Every end of a live run is decided in the model and carried out by the one executor:
``dflashd stop`` (SIGTERM to the job's group, SIGKILL past ``stop_timeout_s``), a stall, no
GPU memory, a diverged loss (:class:`~dflashd.supervisor.model.effects.EndRun`), each a dump
then the kill, or faulthandler's dump where py-spy cannot read the run
(:mod:`~dflashd.supervisor.model.killing`); a proven hang
(:class:`~dflashd.supervisor.model.effects.EndRunHung`), whose proving sample's files are
written here.  This module hands the model what it reads: the run's hang and start-up view
(``step``'s ``HangLook`` arm), a dump that came back (``DumpRead``), the kill's deadline, the
host's answer when the progress deadline passed (``StallLook``).  The run's death then takes
the usual walk (reap -> conclude), its facts saying who ended it (``ended_by``) and where the
dump is (``stacks``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from dflashd.supervisor.host.caches import file_age, stale_build_locks
from dflashd.supervisor.host.clock import Clock
from dflashd.supervisor.model.deadlines import Deadline, Deadlines
from dflashd.supervisor.model.effects import (
    WriteRecord,
)
from dflashd.supervisor.model.events import Event
from dflashd.supervisor.model.hang import HangLimits, HangSampled, HangView, HangWatch
from dflashd.supervisor.model.inputs import (
    DeadlineDue,
    DumpRead,
    HangDumpWritten,
    HangLook,
    Input,
    SlowStacks,
    StacksAsked,
    StallLook,
    StartupView,
)
from dflashd.supervisor.model.judge import SAMPLES, Sample
from dflashd.supervisor.model.progress import Limits
from dflashd.supervisor.model.stacks import StacksDump, StacksTaken, alert_lines
from dflashd.supervisor.watch.run import Run
from dflashd.supervisor.watch.stackdumps import Dumper
from dflashd.supervisor.watch.worldshare import node_rank, world_share


class LiveRunControl:
    """What the shell reads of the live run for the model: its hang view, its dumps, its
    kill's deadline, its stall."""

    def __init__(
        self,
        clock: Clock,
        stall_look: Callable[[Run], StallLook],
        limits: Limits,
        dumps: Dumper,
        deadlines: Callable[[], Deadlines],
        hang: Callable[[], HangWatch],
        look: Callable[[Run | None, Input], object],
    ) -> None:
        self.clock, self.stall_look = clock, stall_look  # what the host says at a stall
        self.limits, self.dumps = limits, dumps
        # the daemon's deadline table and the run's hang watch (the model keeps both), and the
        # way to hand the model what this module knows of the live run (an input)
        self.deadlines, self.hang, self.look = deadlines, hang, look

    def taken(self, run: Run | None, message: StacksTaken) -> None:
        """A dump finished: its files written, and what follows handed to the model (its
        record; the kill that waited for it: model/killing.py)."""
        fields, level = self.dumps.taken(message, self.clock.time())
        said = WriteRecord(Event.STACKS, fields, log_level=level, run_no=message.run_no)
        if message.dump.trigger == "slow" and run is not None and run.run_no == message.run_no:
            self.look(run, SlowStacks(message.run_no, said, fields))  # the straggler, if any
            return
        dump = message.dump
        alive = run is not None and run.run_no == message.run_no and run.alive
        alive = alive and run is not None and run.custody is not None
        kept = kept_stacks(fields)
        read = DumpRead(
            message.run_no, message.dump_id, said, kept, dump.ok, dump.trigger, dump.error, alive
        )
        self.look(run, read)

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

    def hang_dump(self, run: Run) -> HangDumpWritten:
        """A proven hang (the model's verdict): the sample that proved it is the run's dump,
        its file written here and its record handed back; the model kills at once."""
        alive = run.custody is not None and run.alive
        dump = self.hang().last_dump
        if not alive or dump is None:
            return HangDumpWritten(run.run_no, None, None, alive)
        dump.trigger = "hung"
        fields, level = self.dumps.taken(StacksTaken(run.run_no, "hang", dump), self.clock.time())
        said = WriteRecord(Event.STACKS, fields, log_level=level)
        return HangDumpWritten(run.run_no, said, kept_stacks(fields), alive)

    def check(self, run: Run | None, now: float) -> None:
        """The live run's deadlines: the kill after a dump, a hang, a stall (the model decides
        the hang and the stall from what this hands it: ``step``'s hang and stall arms)."""
        live = run is not None and run.alive and run.pid is not None
        if live and run is not None:
            if self.deadlines().is_due(Deadline.KILL, now):
                self.look(run, DeadlineDue(Deadline.KILL))  # a dump past its bound: the kill
            if not run.facts.ended_by_us:
                self._look(run, now)
            facts = run.facts
            stall = None if facts.ended_by_us else facts.progress.stall_deadline(self.limits)
            if stall is not None and now >= stall:
                self.look(run, self.stall_look(run))


def kept_stacks(fields: dict[str, Any]) -> dict[str, Any]:
    """What the run keeps of the dump taken before its kill: its file, the odd rank out, the
    top frames (the exit record and the alert say them)."""
    kept = ("dump_id", "path", "odd_rank_out", "odd_summary", "error")
    stacks = {k: fields[k] for k in kept if fields.get(k) is not None}
    return {**stacks, "top": alert_lines(fields)}


class Asker(Protocol):
    """What ``dflashd stacks`` asks of the core: a dump, through the model (which names it)."""

    state: Any  # the model's state: ``last_dump_id``

    def step(self, run: Run | None, heard: Input, *, run_no: int | None = None) -> None: ...


def stacks_command(
    dumps: Dumper, core: Asker, run: Run | None, request: dict[str, Any]
) -> dict[str, Any]:
    """``dflashd stacks``: a dump of the live run asked of the model (which names it); the
    client waits for its record."""
    if run is None or not run.alive:
        return {"ok": False, "error": "no live run to dump"}
    if not dumps.available:
        return {"ok": False, "error": dumps.tool()}
    core.step(run, StacksAsked(native=bool(request.get("native"))))
    return {"ok": True, "run": run.run_no, "dump_id": core.state.last_dump_id}
