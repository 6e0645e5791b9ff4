"""Watching the live run: output lines, sd_notify messages and GPU samples become progress.

The :class:`RunObserver` takes each piece of evidence with ``now``, updates the run's
:class:`~dflashd.supervisor.watch.progress.Progress` and phase, and writes what it means
(``first_step``, ``progress``, ``child_status``, ``gpu`` records).
It never signals anything: when the evidence says the run must end (no GPU memory past
the grace, a stall), it returns the reason and :mod:`liverun` ends the run.  The
``recovered`` alert is decided by :func:`~dflashd.supervisor.model.incidents.resumed` and carried out
by the daemon's one applier.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Final, Protocol

from dflashd.supervisor.host.notify import NotifyMessage
from dflashd.supervisor.host.processops import ProcessOps
from dflashd.supervisor.host.procfs import CLK_TCK, read_stat
from dflashd.supervisor.model.effects import Effect, UpdateLedger, WriteRecord
from dflashd.supervisor.model.events import Event
from dflashd.supervisor.model.incidents import passed, resumed
from dflashd.supervisor.model.ledger import Incident, Ledger
from dflashd.supervisor.model.verdicts import AlertKind, EndedBy
from dflashd.supervisor.watch.elastic import AgentLine, AgentSaid, ElasticState
from dflashd.supervisor.watch.gpuwatch import GpuWatch
from dflashd.supervisor.watch.linewatch import LineProgress, LinesSeen
from dflashd.supervisor.watch.nvml import GpuSample
from dflashd.supervisor.watch.pacewatch import loss_effects, pace_effects
from dflashd.supervisor.watch.progress import GPU, Change
from dflashd.supervisor.watch.run import Run

_LAST_LINE_CHARS = 500


class Apply(Protocol):
    """The one applier's signature (:meth:`~dflashd.supervisor.core.DaemonCore.apply`)."""

    def __call__(
        self, run: Run | None, effects: Sequence[Effect], /, *, publish: bool = False
    ) -> None:
        """Carry out ``effects`` in order; ``publish``: then write the status once."""
        ...


# agent lines that say torchrun restarts the run's workers itself (goodput: downtime, redone)
_RESTARTING: Final = (
    AgentSaid.WORKER_FAILED,
    AgentSaid.GROUP_RESTART,
    AgentSaid.MEMBERSHIP_RESTART,
)


class RunObserver:
    """Evidence in, progress and records out."""

    def __init__(
        self,
        gpu: GpuWatch,
        ops: ProcessOps,
        ledger: Callable[[], Ledger],
        alerts_on: tuple[AlertKind, ...],
        apply: Apply,
        on_diverge: str = "alert",
    ) -> None:
        self.gpu, self.ops, self.ledger = gpu, ops, ledger
        self.alerts_on, self.on_diverge = alerts_on, on_diverge
        # The model and the one executor (:meth:`~dflashd.supervisor.core.DaemonCore.apply`):
        # the ledger is read here, never written; what changes and what is said go as effects.
        self.apply = apply

    def lines(self, run: Run | None, seen: LinesSeen, now: float) -> bool:
        """Output from the run's pipes; True when something changed."""
        if run is None or run.run_no != seen.run_no or not run.alive:
            return False
        if seen.last_line is not None:
            run.progress = replace(run.progress, last_line=seen.last_line[:_LAST_LINE_CHARS])
        completed = [s for s in seen.agent if self._agent_said(run, s, now)]
        if completed and run.elastic is not None:  # after the batch: its world lines are in
            self._rendezvous_record(run, run.elastic, completed[-1].fields)
        found = seen.progress
        if found is None:
            run.progress = run.progress.on_alive(now)
        else:
            self._stepped(run, found, now)
        if any(said.said in _RESTARTING for said in seen.agent):
            # after the batch's step: it is the failed worker's last one, posted with the
            # agent's line (a restarted worker needs far longer than a post to step again)
            run.progress = run.progress.workers_restarting(now)
        return True

    def _stepped(self, run: Run, found: LineProgress, now: float) -> None:
        run.progress, change = run.progress.on_step(
            now,
            step=found.step,
            first=found.first,
            source=found.source,
            loss=found.loss,
            epoch=found.epoch,
            epoch_index=found.epoch_index,
            batches=found.batches,
            bad_loss=found.bad_loss,
        )
        self._progressed(run, change, now)

    def _say(self, run: Run, *effects: Effect) -> None:
        """What the observer decided, through the model and the one executor."""
        self.apply(run, effects)

    def notify(self, run: Run | None, msg: NotifyMessage, now: float) -> bool:
        """One sd_notify datagram; ignored unless its sender belongs to the live run."""
        if run is None or not run.alive:
            return False
        if msg.sender_pid is not None and not run.belongs(msg.sender_pid):
            return False  # a leftover of an earlier run, or a stranger: not this run's progress
        if run.elastic is not None and msg.sender_pid not in (None, run.pid):
            self._workers_running(run, now)  # a worker speaks: the agent's rendezvous is over
        run.progress, change = run.progress.on_notify(msg, now)
        if change.status is not None:
            self._say(run, WriteRecord(Event.CHILD_STATUS, {"status": change.status}))
        self._progressed(run, change, now)
        return True

    def gpu_sample(self, run: Run | None, sample: GpuSample, now: float) -> EndedBy | None:
        """A GPU sample: records, GPU activity as progress, and whether the run must end."""
        update = self.gpu.on_sample(sample, run, now)
        self.apply(run, update.records)
        if run is None or not run.alive:
            return None
        run.gpu_seen = "busy" if update.active else "idle"  # the hang decider's GPU evidence
        last_step = run.progress.last_progress_mono
        stepping = last_step is not None and now - last_step <= 5.0
        run.gpu_power = run.gpu_power.take(update.power_w, stepping)
        if update.busy_for_s is not None and not run.progress.reached_first_step:
            run.progress, change = run.progress.on_step(now, step=None, first=True, source=GPU)
            self._progressed(run, change, now)
        elif update.active:
            run.progress = run.progress.on_alive(now)
        return EndedBy.NO_GPU_MEMORY if update.no_gpu_memory else None

    def stall_reason(self, run: Run, now: float) -> EndedBy | None:
        """The run passed its deadline: why it ends, or None when it turns out not to be stuck.

        A torchrun agent that launched workers is past its rendezvous even if nothing said so
        (at torchrun's default log level the rendezvous is silent): the process tree decides.
        """
        progress = run.progress
        if progress.rendezvous and run.pid is not None and self.ops.live_children(run.pid):
            self._workers_running(run, now)
            return None
        if self._busy_on_cpu(run):
            # silent but computing: alive, looked at again a period later
            run.progress = progress.on_alive(now)
            return None
        return progress.stall_reason()

    @staticmethod
    def _busy_on_cpu(run: Run) -> bool:
        """Before its first step, with no way to see steps, a silent run that computes is alive.

        Computing is judged by what the run does, never by how much CPU the machine gives
        it: one of its processes is runnable (state R), or the CPU time of all of them (the
        run cgroup's ``cpu.stat``, else their ``/proc`` stats) grew at all since the last
        look.  A job blocked in a wait uses none and is not alive by this rule.
        """
        progress = run.progress
        if progress.reached_first_step or progress.sees_steps or progress.rendezvous:
            return False
        custody = run.custody
        if custody is None:
            return False
        stats = [found for pid in custody.members() if (found := read_stat(pid)) is not None]
        used = custody.cpu_time_s()
        if used is None:
            used = sum(found.cpu_ticks for found in stats) / CLK_TCK
        before, run.cpu_seen_s = run.cpu_seen_s, used
        runnable = any(found.state == "R" for found in stats)
        return runnable or used > (before if before is not None else 0.0)

    def _agent_said(self, run: Run, said: AgentLine, now: float) -> bool:
        """Apply one agent line and record it; True for a completed rendezvous (recorded later)."""
        state = run.elastic
        if state is None or not state.take(said, now):
            return False
        if not run.progress.reached_first_step:  # after it, the stall rule decides alone
            run.progress = replace(run.progress, rendezvous=state.rendezvous == "waiting")
        if said.said is AgentSaid.RENDEZVOUS_DONE:
            return True
        fields: dict[str, Any] = dict(said.fields)
        if said.said is AgentSaid.WORKER_FAILED:
            fields["worker_failures"] = state.worker_failures
            failed = WriteRecord(Event.WORKER_FAILED, fields, log_level="warning")
            self._say(run, UpdateLedger(agent_worker_failures=1), failed)
        elif said.said in (AgentSaid.GROUP_RESTART, AgentSaid.MEMBERSHIP_RESTART):
            cause = "failure" if said.said is AgentSaid.GROUP_RESTART else "node_joined"
            fields = {"by": "torchrun", "cause": cause, "restarts": state.group_restarts, **fields}
            restarted = WriteRecord(Event.WORKERS_RESTARTED, fields, log_level="warning")
            self._say(run, UpdateLedger(agent_restarts=1), restarted)
        elif said.said is AgentSaid.RENDEZVOUS_TIMEOUT:
            self._say(
                run, WriteRecord(Event.RENDEZVOUS, {"state": "timeout", **state.job.fields()})
            )
        else:
            self._rendezvous_record(run, state, fields)
        return False

    def _workers_running(self, run: Run, now: float) -> None:
        state = run.elastic
        run.progress = replace(run.progress, rendezvous=False)
        if state is None or state.rendezvous == "complete":
            return
        state.workers_running()
        self._rendezvous_record(run, state, {"evidence": "workers_running"})

    def _rendezvous_record(self, run: Run, state: ElasticState, fields: dict[str, Any]) -> None:
        fields = {"state": state.rendezvous, **fields}
        if state.rendezvous == "complete":
            fields.setdefault("group_rank", state.group_rank)
            fields.setdefault("group_world_size", state.group_world_size)
        self._say(run, WriteRecord(Event.RENDEZVOUS, fields))

    def _progressed(self, run: Run, change: Change, now: float) -> None:
        progress = run.progress
        self._say(run, *pace_effects(run, change, self.gpu.readings, now))
        if change.diverged:
            before = self.ledger().diverged_at
            said = loss_effects(run, on_diverge=self.on_diverge, diverged_before=before)
            began = progress.losses.diverged_at
            self._say(
                run, *said, *((UpdateLedger(diverged_at=began),) if began is not None else ())
            )
        if change.first_step and run.elastic is not None:
            self._workers_running(run, progress.first_step_mono or run.started_mono)
        if change.first_step and progress.first_step_mono is not None:
            after = round(progress.first_step_mono - run.started_mono, 3)
            source = progress.first_step_source
            fields = {"after_s": after, "step": progress.step, "source": source}
            self._say(run, WriteRecord(Event.FIRST_STEP, fields, log_level="info"))
        self._maybe_recovered(run)
        if change.progress_record:
            self.progress_record(run)

    def _maybe_recovered(self, run: Run) -> None:
        """Training passed the step of the open incident (a stall, a fatal, a crash loop):
        closed, with the ``recovered`` alert where it was a stall or a fatal."""
        ledger = self.ledger()
        incident = ledger.incident
        if incident is None and ledger.recovering_from is not None:
            incident = Incident(ledger.recovering_from, None)  # a fatal before this daemon
        if not run.progress.reached_first_step or not passed(incident, run.progress.step):
            return
        already = frozenset(run.alerted)
        recovering = ledger.recovering_from
        effects = resumed(recovering, alerts_on=self.alerts_on, already_alerted=already)
        self.apply(run, effects, publish=True)

    def progress_record(self, run: Run) -> None:
        """A ``progress`` record of where the run is (rate-limited by Progress; also the last
        point of a run that ends between two records)."""
        progress = run.progress
        fields: dict[str, Any] = {"step": progress.step, "source": progress.step_source}
        if progress.loss is not None:
            fields["loss"] = progress.loss
        if progress.epoch is not None:
            fields["epoch"] = progress.epoch
        run.progress = progress.recorded_now()
        self._say(run, WriteRecord(Event.PROGRESS, fields))
