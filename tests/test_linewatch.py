"""The drain threads' watcher: the first step at once, matching sparingly after it, and every
message (and the exit's flush) still carrying the latest step printed."""

from __future__ import annotations

from dflashd.logs.framer import Frame, LineFramer
from dflashd.supervisor.model.inputs import LinesSeen
from dflashd.supervisor.model.progress import LineProgress
from dflashd.supervisor.watch.linewatch import (
    MATCH_BYTES,
    MATCH_EVERY_S,
    STEP_POST_S,
    LineMatcher,
    LineWatcher,
)


class CountingMatcher(LineMatcher):
    """The built-in formats, counting the frames they were asked about."""

    def __init__(self) -> None:
        super().__init__("", "", True)
        self.calls = 0

    def match(self, frame: Frame) -> LineProgress | None:
        self.calls += 1
        return super().match(frame)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def frame(text: str) -> Frame:
    out = LineFramer().feed(text.encode())
    assert out is not None
    return out


def make() -> tuple[LineWatcher, CountingMatcher, Clock, list[LinesSeen]]:
    matcher, clock, posted = CountingMatcher(), Clock(), []
    return LineWatcher(1, matcher, clock, posted.append), matcher, clock, posted


def test_every_frame_is_matched_until_the_first_step_which_goes_at_once() -> None:
    watcher, matcher, _clock, posted = make()
    for i in range(5):
        watcher("stdout", frame(f"loading shard {i}\n"))
    assert matcher.calls == 5
    watcher("stdout", frame("step 1 loss 9.5\n"))
    assert [m.progress.step for m in posted if m.progress] == [1]
    assert posted[-1].progress is not None and posted[-1].progress.loss == 9.5


def test_a_flood_after_the_first_step_is_matched_sparingly_and_posts_the_latest_step() -> None:
    watcher, matcher, clock, posted = make()
    watcher("stdout", frame("step 1 loss 9.5\n"))
    matcher.calls = 0
    # 1,000 frames in 0.2 s: within one post interval, one match every MATCH_EVERY_S at most.
    for i in range(2, 1002):
        clock.now += 0.0002
        watcher("stdout", frame(f"step {i} loss 2.0\n"))
    assert matcher.calls <= 0.2 / MATCH_EVERY_S + 1
    assert len(posted) == 1  # nothing was due yet
    # The newest frames hold no step; a frame before them, never matched, held the latest.
    clock.now += 0.001
    watcher("stdout", frame("step 1002 loss 1.5\n"))
    for _ in range(3):
        watcher("stdout", frame("saving checkpoint\n"))
    clock.now += STEP_POST_S
    watcher("stdout", frame("checkpoint saved\n"))
    assert posted[-1].progress is not None
    assert (posted[-1].progress.step, posted[-1].progress.loss) == (1002, 1.5)
    assert posted[-1].last_line == "checkpoint saved"


def test_a_flood_never_holds_more_than_its_bound_of_frames_waiting() -> None:
    """Frames wait unmatched for at most MATCH_EVERY_S, or until MATCH_BYTES of them wait:
    a fast flood's 20 ms of 256 KiB frames are never all held (the daemon's memory, issue 53)."""
    watcher, matcher, clock, posted = make()
    watcher("stdout", frame("step 1 loss 9.5\n"))
    matcher.calls = 0
    line = "step 2 loss 2.0 " + "x" * 100 + "\n"
    big = frame(line * (256 * 1024 // len(line)))
    held = []
    for _ in range(4 * MATCH_BYTES // big.nbytes):  # at one instant: no time-based match is due
        watcher("stdout", big)
        held.append(sum(f.nbytes for f in watcher._unmatched))
    assert max(held) < MATCH_BYTES
    assert matcher.calls >= 3
    clock.now += STEP_POST_S
    watcher.flush()
    assert posted[-1].progress is not None and posted[-1].progress.step == 2


def test_the_exit_flush_carries_the_last_step_even_unmatched() -> None:
    watcher, _matcher, clock, posted = make()
    watcher("stdout", frame("step 1 loss 9.5\n"))
    clock.now += 0.001
    watcher("stdout", frame("step 2 loss 9.0\n"))  # within MATCH_EVERY_S: waits unmatched
    watcher("stderr", frame("Traceback (most recent call last):\n"))
    assert watcher.due() is not None  # a step may be waiting in an unmatched frame
    watcher.flush()
    assert posted[-1].progress is not None and posted[-1].progress.step == 2
    assert posted[-1].last_line == "Traceback (most recent call last):"


def test_a_waiting_frame_is_posted_when_due_with_no_more_output() -> None:
    watcher, _matcher, clock, posted = make()
    watcher("stdout", frame("step 1 loss 9.5\n"))
    clock.now += 0.001
    watcher("stdout", frame("step 2 loss 9.0\n"))
    due = watcher.due()
    assert due is not None and due == 100.0 + STEP_POST_S
    assert not watcher.flush_if_due(due - 0.01)
    assert watcher.flush_if_due(due)
    assert posted[-1].progress is not None and posted[-1].progress.step == 2
    assert watcher.due() is None


def test_a_loss_line_before_the_bars_newest_redraw_is_kept_when_matched_late() -> None:
    # A starved drain thread (a loaded box): Hugging Face's loss lines and the bar's redraws
    # after them all wait unmatched; the newest frame holds the step, an older one the loss.
    watcher, _matcher, clock, posted = make()
    watcher("stdout", frame("step 1 loss 9.5\n"))
    clock.now += 0.001
    watcher("stdout", frame("{'loss': '3.888', 'grad_norm': '0.77', 'epoch': '0.75'}\n"))
    for n in range(16, 21):
        watcher("stdout", frame(f" {n * 5}%|#####     | {n}/20 [00:01<00:01,  4.47it/s]\n"))
    watcher("stdout", frame("{'loss': '3.388', 'grad_norm': '0.77', 'epoch': '1.0'}\n"))
    for _ in range(12):  # more redraws than MATCH_BACK
        watcher("stdout", frame("100%|##########| 20/20 [00:04<00:00,  4.47it/s]\n"))
    watcher.flush()
    last = posted[-1].progress
    assert last is not None and (last.step, last.loss, last.epoch) == (20, 3.388, 1.0)


def test_a_nan_in_an_older_waiting_frame_is_never_skipped() -> None:
    """Seen in CI on the loaded machine: the trainer's steps 11, 12 (NaN) and 13 (NaN) waited
    as three frames; only the newest was matched (it had a step and a loss), so the divergence
    began at 13. Every waiting frame that mentions a NaN is read, in order."""
    watcher, _matcher, clock, posted = make()
    watcher("stdout", frame("step 1/60 loss 4.5 acc 0.01\n"))
    for line in (
        "step 11/60 loss 3.920 acc 0.099",
        "step 12/60 loss nan acc 0.106",
        "step 13/60 loss nan acc 0.096",
    ):
        clock.now += MATCH_EVERY_S / 10  # inside one matching interval: the frames wait
        watcher("stdout", frame(line + "\n"))
    watcher.flush()
    progress = posted[-1].progress
    assert progress is not None and progress.step == 13
    assert [step for step, _ in progress.losses_from_nan] == [12, 13]  # from the first NaN on
