"""Progress: how dflashd knows a run is training, and when it stopped moving.

Three kinds of evidence, strongest first: the child's own sd_notify messages (``READY``,
``STEP``, ``WATCHDOG``), its output lines (the user's patterns, then the built-in step
formats of common trainers, then any line as liveness), and its GPUs (sustained
utilisation on the GPUs that hold its memory, from :mod:`gpuwatch`).  :class:`LineMatcher`
runs on the pipe threads; :class:`Progress` is one run's state, driven by the loop with
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

import re
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Final

from dflashd.logs.framer import Frame
from dflashd.supervisor.elastic import AgentLine
from dflashd.supervisor.formats import FormatMatcher, global_step
from dflashd.supervisor.notify import NotifyMessage
from dflashd.supervisor.verdicts import EndedBy

PROGRESS_RECORD_EVERY_S: Final = 30.0
_STATUS_LOSS: Final = re.compile(r"\bloss\s*[=:]?\s*([0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)")
NOTIFY: Final = "notify"
PATTERN: Final = "pattern"
GPU: Final = "gpu"
OUTPUT: Final = "output"


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


@dataclass(frozen=True, slots=True)
class Limits:
    """The two timeouts of the config."""

    first_step_timeout_s: float
    stall_timeout_s: float


def _to_int(value: str) -> int | None:
    try:
        return int(value)
    except ValueError:
        return None


class LineMatcher:
    """The user's patterns, then the built-in formats; safe to call from any thread."""

    def __init__(self, first_step_pattern: str, step_pattern: str, builtin: bool) -> None:
        self._first_re = re.compile(first_step_pattern, re.M) if first_step_pattern else None
        self._step_re = re.compile(step_pattern, re.M) if step_pattern else None
        self._formats = FormatMatcher() if builtin else None

    @property
    def configured(self) -> bool:
        """True when the user gave a pattern (then built-in formats are not consulted)."""
        return self._first_re is not None or self._step_re is not None

    def match(self, frame: Frame) -> LineProgress | None:
        """The last step seen in a frame of lines (and whether one is a first step), or None."""
        if self.configured:
            return self._match_patterns(frame.lines)
        if self._formats is None:
            return None
        if frame.json_lines is not None:  # ASCII fast path: search the bytes, decode nothing
            found = self._formats.last_step_bytes(frame.json_lines)
        else:
            found = self._formats.last_step(frame.lines)
        if found is None:
            return None
        return LineProgress(
            found.step,
            True,
            found.format,
            found.loss,
            found.epoch,
            found.epoch_index,
            found.batches,
        )

    def _match_patterns(self, lines: Sequence[str]) -> LineProgress | None:
        text = "\n".join(lines)
        step: int | None = None
        first = False
        if self._step_re is not None:
            matches = self._step_re.findall(text)
            if matches:
                last = matches[-1]
                step = _to_int(last[0] if isinstance(last, tuple) else last)
                first = step is not None
        if self._first_re is not None and self._first_re.search(text):
            first = True
        if first or step is not None:
            return LineProgress(step, first, PATTERN)
        return None


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


NOTHING: Final = Change()


@dataclass
class Progress:
    """One run's progress; every method takes ``now`` (monotonic seconds)."""

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
    loss: float | None = None
    status_text: str | None = None
    extend_until_mono: float | None = None
    last_record_mono: float = float("-inf")
    last_line: str | None = None
    rendezvous: bool = False  # a torchrun agent waiting for its peers: warm-up, not silence
    epoch: float | None = None  # epochs done, where the output says
    full_batches: int = 0  # the largest epoch total an epoch-structured bar showed
    intervals: deque[float] = field(default_factory=lambda: deque(maxlen=CADENCE_INTERVALS))
    recorded: tuple[int | None, float | None] = (None, None)  # step and epoch of the last record

    @property
    def unrecorded(self) -> bool:
        """The step or epoch moved since the last ``progress`` record (the curve's last point)."""
        moved = (self.step, self.epoch) != self.recorded
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
    ) -> Change:
        """A step (or a first-step marker) from notify, a pattern, a format or the GPUs.

        sd_notify wins over all: once the child reported a step through it, other sources are
        liveness only (their numbers may count something else, a bar's batches say).
        """
        if source != NOTIFY and self.step_source == NOTIFY:
            # the steps come from notify; a printed loss or epoch still says where training is
            self.loss = loss if loss is not None else self.loss
            self.epoch = epoch if epoch is not None else self.epoch
            self.on_alive(now)
            return NOTHING
        self.last_alive_mono = now
        if epoch_index is not None and batches and step is not None:
            # an epoch's bar counts its batches: the global step counts every epoch's
            self.full_batches = max(self.full_batches, batches)
            step = global_step(epoch_index, step, batches, self.full_batches)
        moved = step is not None or (epoch is not None and epoch != self.epoch)
        if epoch is not None:
            self.epoch = epoch
        if source != GPU:
            self.sees_steps = True
            self.reports_steps = self.reports_steps or step is not None or epoch is not None
        if step is not None:
            self.step = step
            self.step_source = source
        if loss is not None:
            self.loss = loss
        became_first = False
        if (first or step is not None) and self.first_step_mono is None:
            self.first_step_mono = now
            self.first_step_source = source
            became_first = True
        if self.first_step_mono is None:
            return NOTHING
        if not moved and not became_first and self.reports_steps:
            return NOTHING  # the same epoch again, or a loss alone: alive, not progress
        if self.last_progress_mono is not None and self.reports_steps:
            self.intervals.append(now - self.last_progress_mono)  # the job's own cadence
        self.last_progress_mono = now
        # Denser early (a short run still draws a curve), every 30 s at most later on.
        every = min(PROGRESS_RECORD_EVERY_S, max(1.0, (now - self.first_step_mono) / 20))
        record = (step is not None or epoch is not None) and now - self.last_record_mono >= every
        if record:
            self.last_record_mono = now
            self.recorded = (self.step, self.epoch)
        return Change(first_step=became_first, progress_record=record)

    def on_alive(self, now: float) -> None:
        """Output or GPU activity that names no step: liveness."""
        self.last_alive_mono = now
        if self.first_step_mono is not None and not self.reports_steps:
            self.last_progress_mono = now

    def on_notify(self, msg: NotifyMessage, now: float) -> Change:
        """One sd_notify datagram from the run's processes."""
        status: str | None = None
        self.sees_steps = True  # the child speaks the protocol
        if msg.step is not None or msg.watchdog:
            self.reports_steps = True
        if msg.status is not None and msg.status[:500] != self.status_text:
            self.status_text = msg.status[:500]  # bounded: it goes into status and state.json
            status = msg.status
            loss = _STATUS_LOSS.search(msg.status)  # "step 120 loss 2.31": chart the loss too
            if loss is not None:
                self.loss = float(loss.group(1))
        if msg.extend_timeout_us is not None and self.first_step_mono is None:
            self.extend_until_mono = now + min(msg.extend_timeout_us / 1e6, 1e7)
        if msg.is_progress:
            change = self.on_step(
                now, step=msg.step, first=msg.ready or msg.step is not None, source=NOTIFY
            )
            return Change(change.first_step, change.progress_record, status)
        self.last_alive_mono = now
        return Change(status=status)

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
        return last + stall_window(limits.stall_timeout_s, tuple(self.intervals))

    def stall_reason(self) -> EndedBy:
        """Which stall a passed deadline means."""
        if self.first_step_mono is None and self.rendezvous:
            return EndedBy.RENDEZVOUS_TIMEOUT
        if self.first_step_mono is None and self.sees_steps:
            return EndedBy.FIRST_STEP_TIMEOUT
        return EndedBy.NO_PROGRESS


@dataclass(frozen=True, slots=True)
class LinesSeen:
    """From a drain thread to the loop: the run printed lines (a step among them, or liveness)."""

    run_no: int
    progress: LineProgress | None
    last_line: str | None
    agent: tuple[AgentLine, ...] = ()  # torchrun agent lines (elastic.py), in order


def _merged(older: LineProgress | None, newer: LineProgress) -> LineProgress:
    """The newer step, keeping a loss or epoch only the older one carried (a loss line is
    followed by a bar redraw, both before the next post)."""
    if older is None or (newer.loss is not None and newer.epoch is not None):
        return newer
    return replace(
        newer,
        step=newer.step if newer.step is not None else older.step,
        loss=newer.loss if newer.loss is not None else older.loss,
        epoch=newer.epoch if newer.epoch is not None else older.epoch,
        epoch_index=newer.epoch_index if newer.step is not None else older.epoch_index,
        batches=newer.batches if newer.step is not None else older.batches,
    )


LIVENESS_POST_S: Final = 1.0  # bare output as liveness: at most one message a second
STEP_POST_S: Final = 0.25  # steps: the first at once, then the latest at most four times a second
LineTap = Callable[[int, str, Frame], None]


class LineWatcher:
    """The drain threads' callback for one run: match every frame, post sparingly.

    Matching is cheap (formats.py bounds it); waking the loop is not, so only the first step
    goes at once; later steps are kept as ``pending`` and the latest is posted at most every
    ``STEP_POST_S``.  :meth:`flush` hands over what is pending when the child dies, so the
    exit record carries the last step it printed.
    """

    def __init__(
        self,
        run_no: int,
        matcher: LineMatcher,
        monotonic: Callable[[], float],
        post: Callable[[LinesSeen], None],
        tap: LineTap | None = None,
    ) -> None:
        self.run_no, self._matcher, self._monotonic, self._post, self._tap = (
            run_no,
            matcher,
            monotonic,
            post,
            tap,
        )
        self._lock = threading.Lock()
        self._last_post = float("-inf")
        self._stepped = False
        self._pending: LineProgress | None = None
        self._last_frame: Frame | None = None  # decoded only when a message is posted
        self.agent_scan: Callable[[Frame], list[AgentLine]] | None = None  # a torchrun job's
        self._agent: list[AgentLine] = []

    def __call__(self, src: str, frame: Frame) -> None:
        if self._tap is not None:
            self._tap(self.run_no, src, frame)
        found = self._matcher.match(frame)
        agent = self.agent_scan(frame) if self.agent_scan is not None else []
        now = self._monotonic()
        with self._lock:
            if found is not None:
                self._pending = _merged(self._pending, found)
            self._last_frame = frame
            self._agent.extend(agent)
            # The first step, and what the agent says (rare), go at once.
            first = (found is not None and not self._stepped) or bool(agent)
            wait = STEP_POST_S if self._pending is not None else LIVENESS_POST_S
            if not first and now - self._last_post < wait:
                return
            message = self._take(now)
        self._post(message)

    def _take(self, now: float) -> LinesSeen:
        recent = self._last_frame.last_lines(8) if self._last_frame is not None else []
        last = [line for line in recent if line.strip()][-1:]  # a bar's clear is not a line
        message = LinesSeen(
            self.run_no, self._pending, last[0] if last else None, tuple(self._agent)
        )
        self._agent.clear()
        self._stepped = self._stepped or self._pending is not None
        self._pending, self._last_post = None, now
        return message

    def due(self) -> float | None:
        """When a pending step must be posted even if no more output comes (monotonic)."""
        with self._lock:
            return None if self._pending is None else self._last_post + STEP_POST_S

    def flush_if_due(self, now: float) -> bool:
        """Post a pending step whose time has come; True when something was posted."""
        due = self.due()
        if due is None or now < due:
            return False
        self.flush()
        return True

    def flush(self) -> None:
        """Post what is pending (on the loop thread: when it is due, or once the child is dead)."""
        with self._lock:
            if self._pending is None and self._last_frame is None and not self._agent:
                return
            message = self._take(self._monotonic())
            self._last_frame = None
        self._post(message)
