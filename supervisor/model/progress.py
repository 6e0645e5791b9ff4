"""Progress: how dflashd knows a run is training, and when it stopped moving.

Three kinds of evidence, strongest first: the child's own sd_notify messages (``READY``,
``STEP``, ``WATCHDOG``), its output lines (the user's patterns, then the built-in step
formats of common trainers, then any line as liveness), and its GPUs (sustained
utilisation on the GPUs that hold its memory, from :mod:`gpuwatch`).  :mod:`linewatch`
matches lines on the pipe threads; :class:`Progress` is one run's state, driven by the loop with
``now`` passed in, returning what changed so the daemon writes the records.

The first-step and stall rule (docs/design.md, "Progress"):

- ``first_step_timeout_s`` applies only once dflashd has a way to see steps (notify
  messages, a configured pattern, or a built-in format seen in the output).  A run dflashd
  cannot read steps from is never ended for want of a recognised first step.
- Without a way to see steps, output and GPU activity are liveness: only
  ``stall_timeout_s`` of total silence and idleness ends the run (as ``no_progress``).
- After the first step, a run that reports steps must keep reporting them; one that does
  not report steps (its first step came from the GPU, say) stays alive by any output or
  GPU activity.
- A torchrun agent waiting in its rendezvous (elastic.py) is warm-up, not silence: until its
  workers run, ``first_step_timeout_s`` from launch applies, and passing it is a
  ``rendezvous_timeout``, not a stall.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from typing import Final

from dflashd.supervisor.model.bounds import bounded_int, finite_float
from dflashd.supervisor.model.divergence import LossWatch, watched
from dflashd.supervisor.model.goodput import Recovery
from dflashd.supervisor.model.pace import STEADY, Pace, PaceChange, paced
from dflashd.supervisor.model.verdicts import EndedBy

PROGRESS_RECORD_EVERY_S: Final = 30.0
_STATUS_LOSS: Final = re.compile(r"\bloss\s*[=:]?\s*([0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)")
NOTIFY: Final = "notify"
PATTERN: Final = "pattern"
GPU: Final = "gpu"
OUTPUT: Final = "output"


def global_step(epoch_index: int, batch: int, batches: int, full_batches: int) -> int:
    """An epoch-structured bar's global step: epochs done times a full epoch's batches, plus
    the batch in this one.  ``full_batches`` is the largest epoch total seen, so a shorter
    last epoch (a bar whose total shrinks) still counts its epochs at full length."""
    return epoch_index * max(batches, full_batches) + batch


@dataclass(frozen=True, slots=True)
class NotifyMessage:
    """One datagram's worth of assignments, with what dflashd understands pulled out."""

    ready: bool = False
    stopping: bool = False
    watchdog: bool = False
    step: int | None = None
    status: str | None = None
    extend_timeout_us: int | None = None
    sender_pid: int | None = None

    @property
    def is_progress(self) -> bool:
        """READY, STEP or WATCHDOG: the child is alive and moving."""
        return self.ready or self.watchdog or self.step is not None


@dataclass(frozen=True, slots=True)
class LineProgress:
    """What a frame of output said about progress."""

    step: int | None
    first: bool
    source: str  # "pattern" or the built-in format's name
    loss: float | None = None
    epoch: float | None = None  # epochs done (a fraction where the line says)
    epoch_index: int | None = None  # an epoch-structured bar: ``step`` is the batch in this epoch
    batches: int | None = None  # ...of this many
    # from the earliest non-finite loss since the last post on, every loss with its step, in
    # order (bounded): a divergence begins at the first, and whether the NaN stayed or a
    # finite loss came back between is judged on them, not on the post's newest alone
    losses_from_nan: tuple[tuple[int | None, float], ...] = ()
    total: int | None = None  # a tqdm bar's total


@dataclass(frozen=True, slots=True)
class Limits:
    """The config's timeouts, and the gap that makes a steady run suspect of a hang."""

    first_step_timeout_s: float
    stall_timeout_s: float
    hang_suspect_s: float = 12.0  # hang.py; 0 turns hang detection off
    remote_wait_s: float = 300.0  # hang.py: a wait on work elsewhere, alerted once after this


CADENCE_INTERVALS: Final = 20  # the step intervals the stall window looks back on
CADENCE_FACTOR: Final = 3.0  # a job is stalled after this many of its slowest recent intervals


def stall_window(stall_timeout_s: float, intervals: tuple[float, ...]) -> float:
    """How long a job that reports steps may go without one: ``stall_timeout_s``, or three
    times the slowest of its last 20 step intervals when that is longer (a job that logs
    every 100 steps at 10 s a step prints every 1,000 s, and is not stalled at 900)."""
    if not intervals:
        return stall_timeout_s
    return max(stall_timeout_s, CADENCE_FACTOR * max(intervals))


@dataclass(frozen=True, slots=True)
class Change:
    """What one piece of evidence changed, for the daemon to record."""

    first_step: bool = False  # this was the run's first step
    progress_record: bool = False  # time for a rate-limited ``progress`` record
    status: str | None = None  # a new STATUS= text from the child
    pace: PaceChange = STEADY  # the run turned slow against its own baseline, or came back
    diverged: bool = False  # this loss made the run's loss diverge (model/divergence.py)


NOTHING: Final = Change()


@dataclass(frozen=True, slots=True)
class Progress:
    """One run's progress, a value: every method takes ``now`` (monotonic seconds) and
    returns the next one (with what changed, for the daemon to record); nothing is changed
    in place."""

    started_mono: float
    sees_steps: bool = False  # dflashd has a way to see steps: notify, a pattern, a format seen
    reports_steps: bool = (
        False  # step numbers (or WATCHDOG) seen: after the first step only they count
    )
    first_step_mono: float | None = None
    first_step_source: str | None = None
    last_progress_mono: float | None = None
    last_alive_mono: float | None = None  # any sign of life: output, GPU activity, notify
    step: int | None = None
    step_source: str | None = None
    loss: float | None = None  # the last finite loss
    loss_step: int | None = None  # the step it was logged at
    loss_unfinite: str | None = None  # the newest loss when it is not finite: "nan", "inf"
    status_text: str | None = None
    extend_until_mono: float | None = None
    last_record_mono: float = float("-inf")
    last_line: str | None = None
    rendezvous: bool = False  # a torchrun agent waiting for its peers: warm-up, not silence
    epoch: float | None = None  # epochs done, where the output says
    full_batches: int = 0  # the largest epoch total an epoch-structured bar showed
    bar_total: int = 0  # the largest total a tqdm bar showed (training's; evaluation's is less)
    intervals: tuple[float, ...] = ()  # the last CADENCE_INTERVALS intervals between steps
    best_before: int | None = None  # the best step of every earlier run (goodput: redone)
    passed_best_mono: float | None = None  # when a step beyond ``best_before`` was first seen
    top_step: int | None = None  # the highest step this run reported
    first_step_no: int | None = None  # the first step number it reported (a relaunch resumes there)
    # restarts its launcher handled itself (torchrun): closed ones, and the open one with the
    # step it must pass again
    recoveries: tuple[Recovery, ...] = ()
    recovering_past: int | None = None
    # step, epoch and loss of the last progress record (the curve's last point)
    recorded: tuple[int | None, float | None, float | None] = (None, None, None)
    pace: Pace = field(default_factory=Pace)  # its own step-time baseline (model/pace.py)
    losses: LossWatch = field(default_factory=LossWatch)  # its loss curve (model/divergence.py)

    @property
    def unrecorded(self) -> bool:
        """The step, epoch or loss moved since the last ``progress`` record (the curve's last point)."""
        moved = (self.step, self.epoch, self.loss) != self.recorded
        return self.first_step_mono is not None and moved and self.reports_steps

    @property
    def reached_first_step(self) -> bool:
        """True once any source saw a first step."""
        return self.first_step_mono is not None

    def on_step(
        self,
        now: float,
        *,
        step: int | None,
        first: bool,
        source: str,
        loss: float | None = None,
        epoch: float | None = None,
        epoch_index: int | None = None,
        batches: int | None = None,
        losses_from_nan: tuple[tuple[int | None, float], ...] = (),
        bar_total: int | None = None,
    ) -> tuple[Progress, Change]:
        """A step (or a first-step marker) from notify, a pattern, a format or the GPUs.

        sd_notify wins over all: once the child reported a step through it, other sources are
        liveness only (their numbers may count something else, a bar's batches say).
        """
        p = self
        evaluating = False
        if bar_total is not None and step is not None and source != NOTIFY:
            behind = p.step is not None and step <= p.step
            # a bar below training's (Hugging Face's evaluation loop draws one with no
            # description and its own, smaller total; a job that prints its steps may draw one
            # to evaluate): its batches are not the run's steps; it is alive
            evaluating = behind and (bar_total < p.bar_total or p.step_source != source)
            if not evaluating:
                p = replace(p, bar_total=max(p.bar_total, bar_total))
        diverged = False
        # from the first NaN among the lines posted together on, each loss in order: the
        # divergence began at the first, and a finite one between ends a NaN streak.  Judged
        # under an evaluation bar too: the training lines printed before it, posted with it,
        # carry their own steps (a post whose newest line was the bar lost its NaNs, and the
        # divergence was dated a step late, issue 53's CI)
        for bad_step, bad in losses_from_nan:
            at = bad_step if bad_step is not None else (p.step if evaluating else step)
            losses, now_diverged = watched(p.losses, bad, at if at is not None else p.step)
            p, diverged = replace(p, losses=losses), diverged or now_diverged
        if evaluating:
            return p.on_alive(now), Change(diverged=True) if diverged else NOTHING
        if loss is not None:  # then the newest (a finite one ends a loss scaler's NaN streak)
            at = step if step is not None else p.step
            losses, now_diverged = watched(p.losses, loss, at)
            p, diverged = replace(p, losses=losses), diverged or now_diverged
        if loss is not None:
            # status, metrics and JSON keep the last finite loss; status says the newest is not
            at = step if step is not None else p.step
            finite = math.isfinite(loss)
            p = replace(
                p,
                loss_unfinite=None if finite else str(loss),
                loss_step=at if finite else p.loss_step,
            )
            loss = loss if finite else None
        quiet = Change(diverged=True) if diverged else NOTHING
        if source != NOTIFY and p.step_source == NOTIFY:
            # the steps come from notify; a printed loss or epoch still says where training is
            p = replace(
                p,
                loss=loss if loss is not None else p.loss,
                epoch=epoch if epoch is not None else p.epoch,
            )
            return p.on_alive(now), quiet
        p = replace(p, last_alive_mono=now)
        before = p.step
        if epoch_index is not None and batches and step is not None:
            # an epoch's bar counts its batches: the global step counts every epoch's
            p = replace(p, full_batches=max(p.full_batches, batches))
            step = bounded_int(global_step(epoch_index, step, batches, p.full_batches))
        # A step posted again (the same line seen on a later wake-up) is not progress: it
        # would count as a step and add a false gap to the job's cadence.
        moved = (step is not None and step != p.step) or (epoch is not None and epoch != p.epoch)
        if epoch is not None:
            p = replace(p, epoch=epoch)
        if source != GPU:
            reports = p.reports_steps or step is not None or epoch is not None
            p = replace(p, sees_steps=True, reports_steps=reports)
        resuming = bool(p.recoveries) and p.recoveries[-1].resumed is None
        if step is not None:
            if p.passed_best_mono is None:
                p = replace(p, passed_best_mono=p._passed_best(step, now))
            p = p._recovering(step, now)
            top = step if p.top_step is None else max(p.top_step, step)
            first_no = step if p.first_step_no is None else p.first_step_no
            p = replace(p, step=step, step_source=source, top_step=top, first_step_no=first_no)
        if loss is not None:
            p = replace(p, loss=loss)
        became_first = False
        if (first or step is not None) and p.first_step_mono is None:
            p = replace(p, first_step_mono=now, first_step_source=source)
            became_first = True
        first_at = p.first_step_mono
        if first_at is None:
            return p, quiet
        if not moved and not became_first and p.reports_steps:
            # the same epoch again, or a loss alone: alive, not progress
            return p, quiet
        pace = STEADY
        if p.last_progress_mono is not None and p.reports_steps and not resuming:
            interval = now - p.last_progress_mono
            intervals = (*p.intervals, interval)[-CADENCE_INTERVALS:]  # the job's own cadence
            p = replace(p, intervals=intervals)
            advanced = step - before if step is not None and before is not None else 1
            if advanced > 0:
                paced_now, pace = paced(p.pace, interval, advanced, now)
                p = replace(p, pace=paced_now)
        p = replace(p, last_progress_mono=now)
        # Denser early (a short run still draws a curve), every 30 s at most later on.
        every = min(PROGRESS_RECORD_EVERY_S, max(1.0, (now - first_at) / 20))
        record = (step is not None or epoch is not None) and now - p.last_record_mono >= every
        if record:
            p = replace(p, last_record_mono=now, recorded=(p.step, p.epoch, p.loss))
        return p, Change(became_first, record, pace=pace, diverged=diverged)

    @property
    def steps_seen(self) -> int:
        """The steps this run advanced since its first step line (0: none or one)."""
        if self.top_step is None or self.first_step_no is None:
            return 0
        return max(0, self.top_step - self.first_step_no)

    def workers_restarting(self, now: float) -> Progress:
        """The launcher restarts the run's workers itself (torchrun: a worker failed, or a
        node joined): from here to the next step is downtime, and steps up to the best one
        so far are redone (goodput).  A second notice before any step is the same restart."""
        if self.first_step_mono is None:
            return self  # still starting: startup either way
        if self.recoveries and self.recoveries[-1].resumed is None:
            return self
        last = self.last_progress_mono or self.first_step_mono
        recovery = Recovery(last_step=last, failed=max(now, last))
        return replace(self, recoveries=(*self.recoveries, recovery), recovering_past=self.top_step)

    def _recovering(self, step: int, now: float) -> Progress:
        """A step after a restart inside the run: its first step, then passing the old best."""
        if not self.recoveries:
            return self
        rec = self.recoveries[-1]
        if rec.resumed is None:
            rec = replace(rec, resumed=now)
        past = self.recovering_past
        if rec.passed is None and (past is None or step > past):
            rec = replace(rec, passed=now)
        return replace(self, recoveries=(*self.recoveries[:-1], rec))

    def _passed_best(self, step: int, now: float) -> float | None:
        """When the run passed the earlier runs' best, if ``step`` passes it: between the last
        step seen and this one, in proportion (steps are posted a few times a second)."""
        best = self.best_before
        if best is not None and step <= best:
            return None
        before, at = self.step, self.last_progress_mono
        if best is None or before is None or at is None or not before <= best < step:
            return now
        return at + (now - at) * (best - before) / (step - before)

    def on_alive(self, now: float) -> Progress:
        """Output or GPU activity that names no step: liveness."""
        if self.first_step_mono is not None and not self.reports_steps:
            return replace(self, last_alive_mono=now, last_progress_mono=now)
        return replace(self, last_alive_mono=now)

    def on_notify(self, msg: NotifyMessage, now: float) -> tuple[Progress, Change]:
        """One sd_notify datagram from the run's processes."""
        status: str | None = None
        p = replace(self, sees_steps=True)  # the child speaks the protocol
        if msg.step is not None or msg.watchdog:
            p = replace(p, reports_steps=True)
        if msg.status is not None and msg.status[:500] != p.status_text:
            p = replace(p, status_text=msg.status[:500])  # bounded: status and state.json
            status = msg.status
            loss = _STATUS_LOSS.search(msg.status)  # "step 120 loss 2.31": chart the loss too
            if loss is not None and (value := finite_float(loss.group(1))) is not None:
                p = replace(p, loss=value)
        if msg.extend_timeout_us is not None and p.first_step_mono is None:
            p = replace(p, extend_until_mono=now + min(msg.extend_timeout_us, 10**13) / 1e6)
        if msg.is_progress:
            p, change = p.on_step(
                now, step=msg.step, first=msg.ready or msg.step is not None, source=NOTIFY
            )
            return p, replace(change, status=status)
        return replace(p, last_alive_mono=now), Change(status=status)

    def recorded_now(self) -> Progress:
        """The curve's last point is the step, epoch and loss as they are (a record written)."""
        return replace(self, recorded=(self.step, self.epoch, self.loss))

    def stall_deadline(self, limits: Limits) -> float | None:
        """When the run counts as stalled if nothing happens before (monotonic seconds)."""
        if self.first_step_mono is None:
            quiet = max(self.started_mono, self.last_alive_mono or self.started_mono)
            silence = quiet + limits.stall_timeout_s
            if not self.sees_steps and not self.rendezvous:
                return silence  # no way to see steps: only total silence ends the run
            deadline = self.started_mono + limits.first_step_timeout_s
            if self.extend_until_mono is not None:
                deadline = max(deadline, self.extend_until_mono)
            return deadline
        last = self.last_progress_mono or self.first_step_mono
        return last + stall_window(limits.stall_timeout_s, self.intervals)

    def stall_reason(self) -> EndedBy:
        """Which stall a passed deadline means."""
        if self.first_step_mono is None and self.rendezvous:
            return EndedBy.RENDEZVOUS_TIMEOUT
        if self.first_step_mono is None and self.sees_steps:
            return EndedBy.FIRST_STEP_TIMEOUT
        return EndedBy.NO_PROGRESS
