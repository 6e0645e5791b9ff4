"""Matching output into progress, on the drain threads: the user's patterns, then the
built-in formats, posted to the loop sparingly.

:class:`LineMatcher` finds the last step in a frame of lines; :class:`LineWatcher` is one
run's callback on its drain threads: it matches frames (every one until the first step, then
at most 50 a second and the newest before each post) and posts a :class:`LinesSeen` message
to the loop's inbox (the first step at once, later ones at most four times a second, bare
output as liveness at most once a second).  The loop hands each message to the model as it
is; ``step``'s reading arm (:mod:`~dflashd.supervisor.model.reading`) makes the run's
:class:`~dflashd.supervisor.model.progress.Progress` of it.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Final

from dflashd.logs.framer import Frame
from dflashd.logs.linecodec import CODEC
from dflashd.supervisor.model.agent import AgentLine
from dflashd.supervisor.model.bounds import bounded_int
from dflashd.supervisor.model.formats import FormatMatcher, StepLine
from dflashd.supervisor.model.inputs import LinesSeen
from dflashd.supervisor.model.progress import LineProgress

PATTERN: Final = "pattern"
MAX_LOSS_MARKS: Final = 8  # losses kept from a NaN on, per post (the rule needs three)


def _to_int(value: str) -> int | None:
    return bounded_int(value)  # a user pattern's match beyond any count is no step


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

    def has_step(self, frame: Frame) -> bool:
        """The frame holds a step, asked cheaply: the built-in formats' search of its last
        lines, none of :meth:`match`'s searches for a NaN (the user's patterns: their match)."""
        if self.configured:
            progress = self._match_patterns(frame.lines)
            return progress is not None and progress.step is not None
        found = self._last_step(frame)
        return found is not None and found.step is not None

    def _last_step(self, frame: Frame) -> StepLine | None:
        """The built-in formats' last step line in a frame (None: none, or no formats)."""
        if self._formats is None:
            return None
        if frame.text is not None:  # ASCII fast path: search the bytes, decode nothing
            return self._formats.last_step_text(frame.text)
        return self._formats.last_step(frame.lines)

    def match(self, frame: Frame) -> LineProgress | None:
        """The last step seen in a frame of lines (and whether one is a first step), or None."""
        if self.configured:
            return self._match_patterns(frame.lines)
        found = self._last_step(frame)
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
            self._losses_from_nan(frame),
            found.total,
        )

    def _losses_from_nan(self, frame: Frame) -> tuple[tuple[int | None, float], ...]:
        """From the first line of the frame whose loss is NaN or infinite on, each loss with
        its step (a frame read at once may hold several steps: the divergence begins at the
        first, and a finite loss after it ends a loss scaler's streak).  Only frames that
        mention a NaN or an infinity are read line by line; at most :data:`MAX_LOSS_MARKS`."""
        if self._formats is None or not _mentions_nonfinite(frame):
            return ()
        marks: list[tuple[int | None, float]] = []
        for line in frame.lines:
            if not marks and "nan" not in line and not any(w in line for w in _INF_WORDS):
                continue
            found = self._formats.last_step([line])
            if found is None or found.loss is None:
                continue
            if marks or not math.isfinite(found.loss):
                marks.append((found.step, found.loss))
                if len(marks) >= MAX_LOSS_MARKS:
                    break
        return tuple(marks)

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


def _merged(older: LineProgress | None, newer: LineProgress) -> LineProgress:
    """The newer step, keeping a loss or epoch only the older one carried (a loss line is
    followed by a bar redraw, both before the next post)."""
    if older is not None and older.losses_from_nan:  # the earliest first, in order (bounded)
        newer = replace(
            newer, losses_from_nan=(*older.losses_from_nan, *newer.losses_from_nan)[:MAX_LOSS_MARKS]
        )
    if older is None or (newer.loss is not None and newer.epoch is not None):
        return newer
    return replace(
        newer,
        step=newer.step if newer.step is not None else older.step,
        loss=newer.loss if newer.loss is not None else older.loss,
        epoch=newer.epoch if newer.epoch is not None else older.epoch,
        epoch_index=newer.epoch_index if newer.step is not None else older.epoch_index,
        batches=newer.batches if newer.step is not None else older.batches,
        total=newer.total if newer.step is not None else older.total,
    )


def _mentions(frame: Frame, word: str) -> bool:
    """The frame's text holds ``word`` (on the bytes where it has them: ``CODEC.mentions``)."""
    if frame.text is not None:
        return CODEC.mentions(frame.text, (word.encode(),))
    return any(word in line for line in frame.lines)


def _mentions_any(frame: Frame) -> bool:
    return _mentions(frame, "loss") or _mentions(frame, "poch")


_INF_WORDS: Final = (" inf", "=inf", ":inf")  # not "INFO", not "info" in a word
_NONFINITE_B: Final = re.compile(rb"nan|[ =:]inf")
_NONFINITE: Final = re.compile(r"nan|[ =:]inf")


_NONFINITE_WORDS_B: Final = (b"nan", b"inf")


def _mentions_nonfinite(frame: Frame) -> bool:
    """The frame may hold a NaN or infinite number.  Every matched frame is asked, so the
    common answer (no) costs one vectorised search per word (``CODEC.mentions``), never a
    regex over the frame: the regex alternation ran at a few hundred MiB/s and cost the log
    path ~6 % of its block-write rate, and CPython's own substring search (0.2 ms a word on
    a flood's 256 KiB frame) was three quarters of a match (issue 53)."""
    if frame.text is not None:
        text = frame.text
        if not CODEC.mentions(text, _NONFINITE_WORDS_B):
            return False
        return _NONFINITE_B.search(text) is not None
    return any(("nan" in line or "inf" in line) and _NONFINITE.search(line) for line in frame.lines)


LIVENESS_POST_S: Final = 1.0  # bare output as liveness: at most one message a second
STEP_POST_S: Final = 0.25  # steps: the first at once, then the latest at most four times a second
MATCH_EVERY_S: Final = 0.02  # after the first step, frames are matched at most 50 times a second
MATCH_BACK: Final = 8  # waiting frames matched, newest first, before a post
# ...and what a flood holds unmatched is bounded whatever its rate (20 ms at 700 MiB/s were
# 14 MiB): past this many bytes, the frames no match would read are forgotten (when the newest
# holds a step: ``LineWatcher._forget_unread``), else they are matched at once.  Matched at once
# every time, a bound of 1 MiB once cost the drain thread a seventh of its block rate (a match
# of a flood's 256 KiB frame took 0.64 ms, most of it CPython's search for a NaN; 0.15 ms in
# C), and 2 MiB still read more bytes than the flood's own; 2 MiB (was 8) lowers a flood's
# peak memory with the sink's queue (logs/sink.py: the trade).
MATCH_BYTES: Final = 2 * 1024 * 1024
# Past the newest step, older frames are searched for its loss or epoch over this many bytes
# at most: a bar's redraws are a few hundred, while a flood's frames are 64 KiB each and each
# search of them cost the log path (a job that never prints an epoch was searched every time).
LOOK_BACK_BYTES: Final = 256 * 1024
LineTap = Callable[[int, str, Frame], None]


class LineWatcher:
    """The drain threads' callback for one run: match sparingly, post sparingly.

    Waking the loop is dear, so only the first step goes at once; later steps are kept as
    ``pending`` and the latest is posted at most every ``STEP_POST_S``.  Matching costs tens
    of microseconds a frame, so once the first step is posted a frame is matched at most
    every ``MATCH_EVERY_S``; the frames in between wait, unmatched, and before anything is
    posted the newest of them are matched, newest first, until one holds a step: a message
    still carries the latest step printed.  :meth:`flush` hands over what is pending when
    the child dies, so the exit record carries the last step it printed.
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
        self._last_match = float("-inf")
        self._stepped = False
        self._pending: LineProgress | None = None
        self._unmatched: list[Frame] = []  # since the last match, oldest first
        self._unmatched_bytes = 0
        self._last_frame: Frame | None = None  # decoded only when a message is posted
        self.agent_scan: Callable[[Frame], list[AgentLine]] | None = None  # a torchrun job's
        self._agent: list[AgentLine] = []

    def __call__(self, src: str, frame: Frame) -> None:
        if self._tap is not None:
            self._tap(self.run_no, src, frame)
        agent = self.agent_scan(frame) if self.agent_scan is not None else []
        now = self._monotonic()
        with self._lock:
            self._last_frame = frame
            self._agent.extend(agent)
            self._unmatched.append(frame)
            self._unmatched_bytes += frame.nbytes
            if not self._stepped or now - self._last_match >= MATCH_EVERY_S:
                self._match_unmatched(now)
            elif self._unmatched_bytes >= MATCH_BYTES:
                self._forget_unread(now)
            # The first step, and what the agent says (rare), go at once.
            first = (self._pending is not None and not self._stepped) or bool(agent)
            waiting = self._pending is not None or self._unmatched
            if not first and now - self._last_post < (STEP_POST_S if waiting else LIVENESS_POST_S):
                return
            self._match_unmatched(now)
            message = self._take(now)
        self._post(message)

    def _forget_unread(self, now: float) -> None:
        """A flood's waiting frames past :data:`MATCH_BYTES`: when the newest holds a step, the
        frames older than it and its look back are forgotten unmatched, since a match
        stops there and never reads them (the next one's newest step is at least as new);
        else they are matched now.  A round matched the newest frames, searching each for a
        NaN, every 2 MiB of a flood: more bytes than the flood's own (issue 53)."""
        if not self._matcher.has_step(self._unmatched[-1]):
            self._match_unmatched(now)
            return
        kept, looked = 1, 0
        for frame in reversed(self._unmatched[:-1]):
            if looked >= LOOK_BACK_BYTES:
                break
            looked += frame.nbytes
            kept += 1
        del self._unmatched[:-kept]
        self._unmatched_bytes = sum(frame.nbytes for frame in self._unmatched)

    def _match_unmatched(self, now: float) -> None:
        """Match the waiting frames newest first, up to the first that holds a step; past it,
        only the frames that mention a loss or an epoch the step lacks (Hugging Face prints
        its loss on a line of its own, then redraws the bar: a starved drain thread can hold
        both, and the curve must not keep an older loss)."""
        if not self._unmatched:
            return
        found: list[LineProgress] = []
        step = loss = epoch = False
        looked = 0  # bytes looked at past the frame with the step
        # past the newest step, a waiting frame that mentions a NaN or an infinity is still read
        # (within the look back): the divergence begins at its first NaN, not at the step that
        # happened to be matched
        for index, frame in enumerate(reversed(self._unmatched)):
            if step:
                if looked >= LOOK_BACK_BYTES:
                    break  # a loss or epoch printed apart from its step sits near it
                looked += frame.nbytes  # the frame next to the step's is read, whatever its size
            if (
                step
                and (loss or not _mentions(frame, "loss"))
                and (epoch or not _mentions(frame, "poch"))
                and not _mentions_nonfinite(frame)
            ):
                continue  # cheap: substring tests, no match
            if not step and index >= MATCH_BACK and not _mentions_any(frame):
                continue
            progress = self._matcher.match(frame)
            if progress is None:
                continue
            found.append(progress)
            step = step or progress.step is not None
            loss = loss or progress.loss is not None
            epoch = epoch or progress.epoch is not None
        for progress in reversed(found):  # oldest first: the newer wins in _merged
            self._pending = _merged(self._pending, progress)
        self._unmatched.clear()
        self._unmatched_bytes = 0
        self._last_match = now

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
            if self._pending is None and not self._unmatched:
                return None
            return self._last_post + STEP_POST_S

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
            now = self._monotonic()
            self._match_unmatched(now)
            message = self._take(now)
            self._last_frame = None
        self._post(message)
