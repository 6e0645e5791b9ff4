"""Watching the live run: output lines, sd_notify messages and GPU samples become progress.

The :class:`RunObserver` reads each piece of evidence with ``now`` into a :class:`Reading`:
the run's next facts (its :class:`~dflashd.supervisor.model.progress.Progress`, GPU use,
open incidents) and what they mean (``first_step``, ``progress``, ``child_status``, ``gpu``
records, the ``recovered`` alert decided by
:func:`~dflashd.supervisor.model.incidents.resumed`), handed to the model as one input.  It
never changes the run's facts, signals or records itself; whether a run that holds no GPU
memory or passed its progress deadline must end is decided by the model (``step``'s GPU and
stall arms), from what this module read of the host.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, Final

from dflashd.supervisor.host.processops import ProcessOps
from dflashd.supervisor.host.procfs import CLK_TCK, read_stat
from dflashd.supervisor.model.effects import (
    Effect,
    PrepareStandby,
    Publish,
    UpdateLedger,
    WriteRecord,
)
from dflashd.supervisor.model.events import Event
from dflashd.supervisor.model.incidents import passed, resumed
from dflashd.supervisor.model.inputs import GpuSeen, Input, Observed, StallLook
from dflashd.supervisor.model.ledger import Incident, Ledger
from dflashd.supervisor.model.progress import GPU, Change, NotifyMessage, Progress
from dflashd.supervisor.model.verdicts import AlertKind
from dflashd.supervisor.watch.elastic import AgentLine, AgentSaid, ElasticState
from dflashd.supervisor.watch.gpuwatch import GpuWatch
from dflashd.supervisor.watch.linewatch import LineProgress, LinesSeen
from dflashd.supervisor.watch.nvml import GpuSample
from dflashd.supervisor.watch.pacewatch import PaceWatch, loss_effects
from dflashd.supervisor.watch.run import Run

_LAST_LINE_CHARS = 500


class Reading:
    """One piece of evidence being read: the run's next facts and what they say, built up in
    order and handed to the model together (:class:`~dflashd.supervisor.model.inputs.Observed`).
    A scratch value of one call, never kept."""

    def __init__(self, run: Run) -> None:
        self.run, self.facts = run, run.facts
        self.effects: list[Effect] = []

    @property
    def progress(self) -> Progress:
        """The run's progress as read so far."""
        return self.facts.progress

    def moved(self, progress: Progress) -> None:
        """The run's progress is now ``progress``."""
        self.facts = replace(self.facts, progress=progress)

    def say(self, *effects: Effect) -> None:
        """What the evidence says, after what was said before."""
        self.effects.extend(effects)

    def observed(self) -> Observed:
        """The reading as the model's input."""
        return Observed(self.facts, tuple(self.effects))


# agent lines that say torchrun restarts the run's workers itself (goodput: downtime, redone)
_RESTARTING: Final = (
    AgentSaid.WORKER_FAILED,
    AgentSaid.GROUP_RESTART,
    AgentSaid.MEMBERSHIP_RESTART,
)


class RunObserver:
    """Evidence in, the run's next facts and records out, through the model."""

    def __init__(
        self,
        gpu: GpuWatch,
        ops: ProcessOps,
        ledger: Callable[[], Ledger],
        alerts_on: tuple[AlertKind, ...],
        step: Callable[[Run | None, Input], object],
        on_diverge: str = "alert",
    ) -> None:
        self.gpu, self.ops, self.ledger = gpu, ops, ledger
        self.alerts_on, self.on_diverge = alerts_on, on_diverge
        # The model and the one executor (:meth:`~dflashd.supervisor.core.DaemonCore.step`):
        # the ledger and the run's facts are read here, never written; a reading goes to the
        # model as one input, the run's next facts with what they say.
        self.step = step
        self.pace = PaceWatch()  # the slowness evidence of the current run (its CPU waits)

    def _hand_in(self, reading: Reading) -> None:
        self.step(reading.run, reading.observed())

    def lines(self, run: Run | None, seen: LinesSeen, now: float) -> bool:
        """Output from the run's pipes; True when something changed."""
        if run is None or run.run_no != seen.run_no or not run.alive:
            return False
        r = Reading(run)
        if seen.last_line is not None:
            r.moved(replace(r.progress, last_line=seen.last_line[:_LAST_LINE_CHARS]))
        completed = [s for s in seen.agent if self._agent_said(r, s, now)]
        if completed and run.elastic is not None:  # after the batch: its world lines are in
            r.say(rendezvous_record(run.elastic, completed[-1].fields))
        found = seen.progress
        if found is None:
            r.moved(r.progress.on_alive(now))
        else:
            self._stepped(r, found, now)
        if any(said.said in _RESTARTING for said in seen.agent):
            # after the batch's step: it is the failed worker's last one, posted with the
            # agent's line (a restarted worker needs far longer than a post to step again)
            r.moved(r.progress.workers_restarting(now))
        self._hand_in(r)
        return True

    def _stepped(self, r: Reading, found: LineProgress, now: float) -> None:
        progress, change = r.progress.on_step(
            now,
            step=found.step,
            first=found.first,
            source=found.source,
            loss=found.loss,
            epoch=found.epoch,
            epoch_index=found.epoch_index,
            batches=found.batches,
            losses_from_nan=found.losses_from_nan,
            bar_total=found.total,
        )
        r.moved(progress)
        self._progressed(r, change, now)

    def datagram(self, run: Run | None, msg: NotifyMessage, now: float) -> bool:
        """One sd_notify datagram; ignored unless its sender belongs to the live run."""
        if run is None or not run.alive:
            return False
        if msg.sender_pid is not None and not run.belongs(msg.sender_pid):
            return False  # a leftover of an earlier run, or a stranger: not this run's progress
        r = Reading(run)
        if msg.sender_pid is not None:
            r.facts = r.facts.saw({msg.sender_pid})  # remembered for the GPU join
        if run.elastic is not None and msg.sender_pid not in (None, run.pid):
            self._workers_running(r, now)  # a worker speaks: the agent's rendezvous is over
        progress, change = r.progress.on_notify(msg, now)
        r.moved(progress)
        if change.status is not None:
            r.say(WriteRecord(Event.CHILD_STATUS, {"status": change.status}))
        self._progressed(r, change, now)
        self._hand_in(r)
        return True

    def gpu_sample(self, run: Run | None, sample: GpuSample, now: float) -> None:
        """A GPU sample: records, the run's GPU evidence, GPU activity as progress; the model
        decides whether a run holding no GPU memory ends (``step``'s GPU arm)."""
        update = self.gpu.on_sample(sample, run, now)
        if run is None or not run.alive:
            self.step(run, GpuSeen(None, tuple(update.records), self.gpu.last))
            return
        r = Reading(run)
        r.say(*update.records)
        r.facts = r.facts.saw(update.tree)
        if update.use is not None:
            xids = r.facts.gpu_xids + update.xids
            r.facts = replace(r.facts, gpu_use=update.use, gpu_xids=xids)
        busy = "busy" if update.active else "idle"  # the hang decider's GPU evidence
        last_step = r.progress.last_progress_mono
        stepping = last_step is not None and now - last_step <= 5.0
        power = r.facts.gpu_power.take(update.power_w, stepping)
        r.facts = replace(r.facts, gpu_seen=busy, gpu_power=power)
        if update.busy_for_s is not None and not r.progress.reached_first_step:
            progress, change = r.progress.on_step(now, step=None, first=True, source=GPU)
            r.moved(progress)
            self._progressed(r, change, now)
        elif update.active:
            r.moved(r.progress.on_alive(now))
        # the model decides on this sample's join whether the run holds no GPU memory
        self.step(run, GpuSeen(r.facts, tuple(r.effects), self.gpu.last, update.judged))

    def stall_look(self, run: Run, now: float) -> StallLook | None:
        """The run passed its progress deadline: what the host says of it, for the model's
        stall decider (None: a torchrun agent whose workers run, past its rendezvous even if
        nothing said so: at torchrun's default log level the rendezvous is silent)."""
        progress = run.facts.progress
        if progress.rendezvous and run.pid is not None and self.ops.live_children(run.pid):
            r = Reading(run)
            self._workers_running(r, now)
            self._hand_in(r)
            return None
        custody = run.custody  # whether the CPU counts as a sign of life is the model's rule
        if custody is None:
            return StallLook(run.run_no, False, None)
        stats = [found for pid in custody.members() if (found := read_stat(pid)) is not None]
        used = custody.cpu_time_s()
        if used is None:
            used = sum(found.cpu_ticks for found in stats) / CLK_TCK
        return StallLook(run.run_no, any(found.state == "R" for found in stats), used)

    def _agent_said(self, r: Reading, said: AgentLine, now: float) -> bool:
        """Apply one agent line and record it; True for a completed rendezvous (recorded later)."""
        state = r.run.elastic
        if state is None or not state.take(said, now):
            return False
        if not r.progress.reached_first_step:  # after it, the stall rule decides alone
            r.moved(replace(r.progress, rendezvous=state.rendezvous == "waiting"))
        if said.said is AgentSaid.RENDEZVOUS_DONE:
            return True
        fields: dict[str, Any] = dict(said.fields)
        if said.said is AgentSaid.WORKER_FAILED:
            fields["worker_failures"] = state.worker_failures
            failed = WriteRecord(Event.WORKER_FAILED, fields, log_level="warning")
            r.say(UpdateLedger(agent_worker_failures=1), failed)
        elif said.said in (AgentSaid.GROUP_RESTART, AgentSaid.MEMBERSHIP_RESTART):
            cause = "failure" if said.said is AgentSaid.GROUP_RESTART else "node_joined"
            fields = {"by": "torchrun", "cause": cause, "restarts": state.group_restarts, **fields}
            restarted = WriteRecord(Event.WORKERS_RESTARTED, fields, log_level="warning")
            r.say(UpdateLedger(agent_restarts=1), restarted)
        elif said.said is AgentSaid.RENDEZVOUS_TIMEOUT:
            r.say(WriteRecord(Event.RENDEZVOUS, {"state": "timeout", **state.job.fields()}))
        else:
            r.say(rendezvous_record(state, fields))
        return False

    def _workers_running(self, r: Reading, now: float) -> None:
        state = r.run.elastic
        r.moved(replace(r.progress, rendezvous=False))
        if state is None or state.rendezvous == "complete":
            return
        state.workers_running()
        r.say(rendezvous_record(state, {"evidence": "workers_running"}))

    def _progressed(self, r: Reading, change: Change, now: float) -> None:
        run = r.run
        progress = r.progress
        r.facts, said = self.pace.effects(run, r.facts, change, self.gpu.readings, now)
        r.say(*said)
        if change.diverged:
            before = self.ledger().diverged_at
            lines = tuple(line for drain in run.drains for line in drain.tail)[-15:]
            r.facts, said = loss_effects(
                r.facts, on_diverge=self.on_diverge, before=before, tail=lines
            )
            began = progress.losses.diverged_at
            r.say(*said, *((UpdateLedger(diverged_at=began),) if began is not None else ()))
        if change.first_step and run.elastic is not None:
            self._workers_running(r, progress.first_step_mono or r.facts.started_mono)
        if change.first_step and progress.first_step_mono is not None:
            after = round(progress.first_step_mono - r.facts.started_mono, 3)
            source = progress.first_step_source
            fields = {"after_s": after, "step": progress.step, "source": source}
            r.say(WriteRecord(Event.FIRST_STEP, fields, log_level="info"), PrepareStandby())
        self._maybe_recovered(r)
        if change.progress_record:
            self._progress_record(r)

    def _maybe_recovered(self, r: Reading) -> None:
        """Training passed the step of the open incident (a stall, a fatal, a crash loop):
        closed, with the ``recovered`` alert where it was a stall or a fatal."""
        ledger = self.ledger()
        incident = ledger.incident
        if incident is None and ledger.recovering_from is not None:
            incident = Incident(ledger.recovering_from, None)  # a fatal before this daemon
        if not r.progress.reached_first_step or not passed(incident, r.progress.step):
            return
        effects = resumed(
            ledger.recovering_from,
            alerts_on=self.alerts_on,
            already_alerted=r.facts.alerted,
            last_exit=ledger.last_exit,
            step=r.progress.step,
        )
        r.say(*effects, Publish())

    def progress_record(self, run: Run) -> None:
        """A ``progress`` record of where the run is (the last point of a run that ends
        between two records)."""
        r = Reading(run)
        self._progress_record(r)
        self._hand_in(r)

    @staticmethod
    def _progress_record(r: Reading) -> None:
        """A ``progress`` record of where the run is (rate-limited by Progress)."""
        progress = r.progress
        fields: dict[str, Any] = {"step": progress.step, "source": progress.step_source}
        if progress.loss is not None:
            fields["loss"] = progress.loss
        if progress.epoch is not None:
            fields["epoch"] = progress.epoch
        r.moved(progress.recorded_now())
        r.say(WriteRecord(Event.PROGRESS, fields))


def rendezvous_record(state: ElasticState, fields: dict[str, Any]) -> WriteRecord:
    """The ``rendezvous`` record of the agent's state now."""
    fields = {"state": state.rendezvous, **fields}
    if state.rendezvous == "complete":
        fields.setdefault("group_rank", state.group_rank)
        fields.setdefault("group_world_size", state.group_world_size)
    return WriteRecord(Event.RENDEZVOUS, fields)
