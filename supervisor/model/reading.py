"""What new evidence of the live run means: ``step``'s arms for its output lines, a notify
datagram, a GPU sample, a slowdown's causes and stacks, and its reap.

Each takes the run's facts and what the shell read, and returns the run's next facts and what
follows, in order: its progress (:mod:`progress`), its torchrun agent's view (:mod:`agent`),
the first step, the ``progress`` curve, a slowdown opened (its causes asked of the host) or
closed (:mod:`pace`), a divergence (ended with ``on_diverge = "stop"``, or when a relaunch
diverges at the step the last one did), and the ``recovered`` alert once training passes an
open incident (:mod:`incidents`).  Whether a run holding no GPU memory ends is ``step``'s GPU
arm.  No clock, no I/O: the shell reads, and only reads.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Final

from dflashd.supervisor.model.agent import RESTARTING, AgentLine, AgentSaid, AgentView
from dflashd.supervisor.model.effects import (
    DumpStacks,
    Effect,
    EndRun,
    KeepPaceBaseline,
    LookForSlowCauses,
    PrepareStandby,
    Publish,
    SendAlert,
    UpdateLedger,
    WriteRecord,
)
from dflashd.supervisor.model.events import Event
from dflashd.supervisor.model.gpuuse import holds_no_gpu_memory
from dflashd.supervisor.model.incidents import passed, resumed
from dflashd.supervisor.model.inputs import (
    GpuSeen,
    LinesSeen,
    NotifyRead,
    SlowCauses,
    SlowStacks,
)
from dflashd.supervisor.model.ledger import Incident, Ledger
from dflashd.supervisor.model.progress import GPU, Change, LineProgress, Progress
from dflashd.supervisor.model.runstate import RunState
from dflashd.supervisor.model.verdicts import AlertKind, EndedBy, Notice, Verdict

LAST_LINE_CHARS: Final = 500
SAME_STEP_SLACK: Final = 0.02  # a relaunch diverging within 2 % (or 10 steps) of the last one
STRAGGLER_DUMPS: Final = 3  # one dump can catch every rank in its collective at once
STEPPING_S: Final = 5.0  # a step this recent: the GPUs' power is a stepping run's


@dataclass(frozen=True, slots=True)
class Against:
    """What a reading is judged against: the counters kept between runs, and the config's
    alerts and divergence policy."""

    ledger: Ledger
    alerts_on: tuple[AlertKind, ...]
    on_diverge: str = "alert"
    vram_grace_s: float = 300.0  # a run with no first step holding no GPU memory past it ends


class _Reading:
    """One reading, built up in order: the run's next facts and what follows (a scratch value
    of one call, never kept)."""

    def __init__(self, run: RunState, against: Against) -> None:
        self.run, self.against = run, against
        self.effects: list[Effect] = []

    @property
    def progress(self) -> Progress:
        return self.run.progress

    def moved(self, progress: Progress) -> None:
        self.run = replace(self.run, progress=progress)

    def say(self, *effects: Effect) -> None:
        self.effects.extend(effects)

    def done(self) -> tuple[RunState, tuple[Effect, ...]]:
        return self.run, tuple(self.effects)


Read = tuple[RunState, tuple[Effect, ...]]
Evidence = LinesSeen | NotifyRead | GpuSeen | SlowCauses | SlowStacks


def read(run: RunState | None, heard: Evidence, against: Against, now: float) -> Read | None:
    """``step``'s reading arms: the current run's next facts and what follows; None where the
    evidence is of no current run (a GPU sample's own records still follow)."""
    if run is None or run.run_no != heard.run_no:
        return None
    match heard:
        case LinesSeen():
            return lines_seen(run, heard, against, now)
        case NotifyRead():
            return notify_read(run, heard, against, now)
        case GpuSeen():
            run, effects = gpu_seen(run, heard, against, now)
            return run, (*effects, *no_gpu_memory(run, heard, against.vram_grace_s, now))
        case SlowCauses():
            return slow_causes(run, heard, now)
        case SlowStacks():
            return slow_stacks(run, heard)


def lines_seen(run: RunState, seen: LinesSeen, against: Against, now: float) -> Read:
    """Output from the run's pipes: its last line, its agent's lines, a step or liveness."""
    r = _Reading(run, against)
    if seen.last_line is not None:
        r.moved(replace(r.progress, last_line=seen.last_line[:LAST_LINE_CHARS]))
    completed = [said for said in seen.agent if _agent_said(r, said, now)]
    if completed and r.run.agent is not None:  # after the batch: its world lines are in
        r.say(_rendezvous(r.run.agent, completed[-1].fields))
    if seen.progress is None:
        r.moved(r.progress.on_alive(now))
    else:
        _stepped(r, seen.progress, seen.tail, now)
    if any(said.said in RESTARTING for said in seen.agent):
        # after the batch's step: it is the failed worker's last one, posted with the agent's
        # line (a restarted worker needs far longer than a post to step again)
        r.moved(r.progress.workers_restarting(now))
    return r.done()


def notify_read(run: RunState, heard: NotifyRead, against: Against, now: float) -> Read:
    """One sd_notify datagram of the run (its sender proven the run's)."""
    r, msg = _Reading(run, against), heard.message
    if msg.sender_pid is not None:
        r.run = r.run.saw({msg.sender_pid})  # remembered for the GPU join
    if heard.worker and r.run.agent is not None:
        _workers_running(r)  # a worker speaks: the agent's rendezvous is over
    progress, change = r.progress.on_notify(msg, now)
    r.moved(progress)
    if change.status is not None:
        r.say(WriteRecord(Event.CHILD_STATUS, {"status": change.status}))
    _progressed(r, change, (), now)
    return r.done()


def gpu_seen(run: RunState, seen: GpuSeen, against: Against, now: float) -> Read:
    """A GPU sample joined with the run: its records, the run's GPU evidence, GPU activity as
    progress (a run busy on its GPUs for long enough has begun training)."""
    r = _Reading(run, against)
    r.say(*seen.records)
    r.run = r.run.saw(seen.tree)
    if seen.held is not None:
        r.run = replace(r.run, gpu_use=seen.held, gpu_xids=r.run.gpu_xids + seen.xids)
    last_step = r.progress.last_progress_mono
    stepping = last_step is not None and now - last_step <= STEPPING_S
    power = r.run.gpu_power.take(seen.power_w, stepping)
    r.run = replace(r.run, gpu_seen="busy" if seen.active else "idle", gpu_power=power)
    if seen.busy and not r.progress.reached_first_step:
        progress, change = r.progress.on_step(now, step=None, first=True, source=GPU)
        r.moved(progress)
        _progressed(r, change, (), now)
    elif seen.active:
        r.moved(r.progress.on_alive(now))
    return r.done()


def workers_run(run: RunState, against: Against) -> Read:
    """The run passed its progress deadline in its rendezvous, and its agent's workers run:
    past the rendezvous, even if nothing said so (at torchrun's default log level it is
    silent); not stalled."""
    r = _Reading(run, against)
    _workers_running(r)
    return r.done()


def reaped(run: RunState, against: Against) -> Read:
    """The run's root was reaped: a ``progress`` record of where it was (the curve ends where
    the run did, between two rate-limited records; ``step``'s ``Reaped`` arm)."""
    if not run.progress.unrecorded:
        return run, ()
    r = _Reading(run, against)
    _progress_record(r)
    return r.done()


def slow_causes(run: RunState, heard: SlowCauses, now: float) -> Read:
    """The host said why the run turned slow: the ``slow`` record, its alert, and a stacks
    dump (with several ranks, its odd rank out is the straggler)."""
    progress = run.progress
    pace = progress.pace
    if pace.baseline_s is None or pace.slow_since is None:
        return run, ()  # back to its pace before the answer came
    ratio = pace.ratio or 0.0
    fields: dict[str, Any] = {
        "ratio": round(ratio, 3),
        "baseline_step_s": round(pace.baseline_s, 6),
        "recent_step_s": round(pace.baseline_s * ratio, 6),
        "step": progress.step,
        "causes": list(heard.causes),
        "slow_for_s": round(max(0.0, now - pace.slow_since), 1),  # when it began
    }
    run = replace(run, slow={**fields, "since_mono": pace.slow_since})
    why = f"{ratio:.2f}x its own step time ({'; '.join(heard.causes)})"
    return run, (
        WriteRecord(Event.SLOW, fields, log_level="warning"),
        SendAlert(Notice.SLOW, why, fields),
        DumpStacks("slow", ""),
    )


def slow_stacks(run: RunState, heard: SlowStacks) -> Read:
    """The stacks taken at a slowdown: with several ranks, the odd rank out is the straggler;
    none found among several ranks, another dump, up to :data:`STRAGGLER_DUMPS`."""
    fields, slow = heard.fields, run.slow
    if slow is None:
        return run, (heard.said,)
    odd = fields.get("odd_rank_out")
    ranks = [p for p in fields.get("processes") or () if p.get("rank") is not None]
    if not odd:
        tries = int(slow.get("dumps", 1))
        if len(ranks) >= 2 and tries < STRAGGLER_DUMPS:
            run = replace(run, slow={**slow, "dumps": tries + 1})
            return run, (heard.said, DumpStacks("slow", ""))
        return run, (heard.said,)
    said = {"straggler_ranks": odd, "where": fields.get("odd_summary")}
    run = replace(run, slow={**slow, "straggler": said})
    return run, (heard.said, WriteRecord(Event.SLOW_CAUSE, said, log_level="warning"))


def _stepped(r: _Reading, found: LineProgress, tail: tuple[str, ...], now: float) -> None:
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
    _progressed(r, change, tail, now)


def _agent_said(r: _Reading, said: AgentLine, now: float) -> bool:
    """One agent line taken and recorded; True for a completed rendezvous (recorded later)."""
    if r.run.agent is None:
        return False
    agent, worth = r.run.agent.took(said, now)
    r.run = replace(r.run, agent=agent)
    if not worth:
        return False
    if not r.progress.reached_first_step:  # after it, the stall rule decides alone
        r.moved(replace(r.progress, rendezvous=agent.rendezvous == "waiting"))
    if said.said is AgentSaid.RENDEZVOUS_DONE:
        return True
    fields: dict[str, Any] = dict(said.fields)
    if said.said is AgentSaid.WORKER_FAILED:
        fields["worker_failures"] = agent.worker_failures
        failed = WriteRecord(Event.WORKER_FAILED, fields, log_level="warning")
        r.say(UpdateLedger(agent_worker_failures=1), failed)
    elif said.said in (AgentSaid.GROUP_RESTART, AgentSaid.MEMBERSHIP_RESTART):
        cause = "failure" if said.said is AgentSaid.GROUP_RESTART else "node_joined"
        fields = {"by": "torchrun", "cause": cause, "restarts": agent.group_restarts, **fields}
        restarted = WriteRecord(Event.WORKERS_RESTARTED, fields, log_level="warning")
        r.say(UpdateLedger(agent_restarts=1), restarted)
    elif said.said is AgentSaid.RENDEZVOUS_TIMEOUT:
        r.say(WriteRecord(Event.RENDEZVOUS, {"state": "timeout", **agent.job.fields()}))
    else:
        r.say(_rendezvous(agent, fields))
    return False


def _workers_running(r: _Reading) -> None:
    r.moved(replace(r.progress, rendezvous=False))
    agent = r.run.agent
    if agent is None or agent.rendezvous == "complete":
        return
    r.run = replace(r.run, agent=agent.running())
    r.say(_rendezvous(agent.running(), {"evidence": "workers_running"}))


def _progressed(r: _Reading, change: Change, tail: tuple[str, ...], now: float) -> None:
    """What a step (or a notify) changed: pace, loss, first step, recovery, the curve."""
    _paced(r, change, now)
    if change.diverged:
        _diverged(r, tail)
    progress = r.progress
    if change.first_step and r.run.agent is not None:
        _workers_running(r)
    if change.first_step and progress.first_step_mono is not None:
        after = round(progress.first_step_mono - r.run.started_mono, 3)
        fields = {"after_s": after, "step": progress.step, "source": progress.first_step_source}
        r.say(WriteRecord(Event.FIRST_STEP, fields, log_level="info"), PrepareStandby())
    _maybe_recovered(r)
    if change.progress_record:
        _progress_record(r)


def _paced(r: _Reading, change: Change, now: float) -> None:
    """The run's own step time learnt (the host kept as it is now, and said), a slowdown
    opened (its causes asked of the host) or closed."""
    progress = r.progress
    pace = progress.pace
    if change.pace.learnt and pace.baseline_s is not None:
        base = {"baseline_step_s": round(pace.baseline_s, 6), "step": progress.step}
        r.say(KeepPaceBaseline(), WriteRecord(Event.PACE, base))
    if change.pace.opened and pace.baseline_s is not None and pace.slow_since is not None:
        r.say(LookForSlowCauses(pace.slow_since, pace.ratio))
    elif change.pace.closed and r.run.slow is not None:
        fields = {
            "worst_ratio": round(pace.worst_ratio, 3),
            "lost_s": round(pace.lost_s, 3),
            "step": progress.step,
        }
        back = f"back to its own pace (it was up to {pace.worst_ratio:.2f}x slower)"
        r.run = replace(r.run, slow=None)
        r.say(WriteRecord(Event.SLOW_OVER, fields), SendAlert(Notice.RECOVERED, back, fields))


def _diverged(r: _Reading, tail: tuple[str, ...]) -> None:
    """The loss diverged: said once; with ``on_diverge = "stop"`` (or a relaunch diverging at
    the same step again) the run is ended, no restart, and the end's alert says it."""
    watch = r.progress.losses
    began, before = watch.diverged_at, r.against.ledger.diverged_at
    fields: dict[str, Any] = {"step": began, "last_good_step": watch.last_good_step}
    fields["why"] = watch.why
    again = (
        before is not None
        and began is not None
        and abs(began - before) <= max(10, SAME_STEP_SLACK * abs(before))
    )
    stop = r.against.on_diverge == "stop" or again
    fields["then"] = "stop" if stop else "alert"
    if again:
        fields["again_at_step"] = before
    r.run = replace(r.run, diverged=fields)
    r.say(WriteRecord(Event.DIVERGED, fields, log_level="warning"))
    if stop:  # the end's own alert (fatal) says the last good step
        r.say(EndRun(EndedBy.DIVERGED))
    else:  # the alert carries the job's last lines: the divergence as the job printed it
        why = f"the loss diverged at step {began} (last good step {watch.last_good_step})"
        alert = SendAlert(Verdict.DIVERGED, f"{why}: {watch.why}", {**fields, "tail": list(tail)})
        r.say(alert)
    if began is not None:
        r.say(UpdateLedger(diverged_at=began))


def _maybe_recovered(r: _Reading) -> None:
    """Training passed the step of the open incident (a stall, a fatal, a crash loop):
    closed, with the ``recovered`` alert where it was a stall or a fatal."""
    ledger = r.against.ledger
    incident = ledger.incident
    if incident is None and ledger.recovering_from is not None:
        incident = Incident(ledger.recovering_from, None)  # a fatal before this daemon
    if not r.progress.reached_first_step or not passed(incident, r.progress.step):
        return
    effects = resumed(
        ledger.recovering_from,
        alerts_on=r.against.alerts_on,
        already_alerted=r.run.alerted,
        last_exit=ledger.last_exit,
        step=r.progress.step,
    )
    r.say(*effects, Publish())


def _progress_record(r: _Reading) -> None:
    """A ``progress`` record of where the run is (rate-limited by Progress)."""
    progress = r.progress
    fields: dict[str, Any] = {"step": progress.step, "source": progress.step_source}
    if progress.loss is not None:
        fields["loss"] = progress.loss
    if progress.epoch is not None:
        fields["epoch"] = progress.epoch
    r.moved(progress.recorded_now())
    r.say(WriteRecord(Event.PROGRESS, fields))


def no_gpu_memory(run: RunState, seen: GpuSeen, grace_s: float, now: float) -> tuple[Effect, ...]:
    """``step``'s GPU arm: a live run with no first step that holds no GPU memory past its
    grace (``seen.use``: what the sample found it holds) is ended, its GPUs' snapshot said
    first."""
    use = seen.use
    if use is None or run.ended_by_us:
        return ()
    reached = run.progress.reached_first_step
    if not holds_no_gpu_memory(
        use, started_mono=run.started_mono, grace_s=grace_s, reached_first_step=reached, now=now
    ):
        return ()
    snapshot = {"gpus": [dict(g) for g in seen.gpus], "method": use.method}
    return (WriteRecord(Event.GPU_SNAPSHOT, snapshot), EndRun(EndedBy.NO_GPU_MEMORY))


def _rendezvous(agent: AgentView, fields: dict[str, Any]) -> WriteRecord:
    return WriteRecord(Event.RENDEZVOUS, agent.said(fields))
