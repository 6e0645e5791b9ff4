"""The drain threads' watcher: the first step at once, matching sparingly after it, and every
message (and the exit's flush) still carrying the latest step printed."""

from __future__ import annotations

from dflashd.logs.framer import Frame, LineFramer
from dflashd.supervisor.model.inputs import LinesSeen
from dflashd.supervisor.model.progress import LineProgress
from dflashd.supervisor.watch.linewatch import (
    LOOK_BACK_BYTES,
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
    a fast flood's 20 ms of frames are never all held (the daemon's memory, issue 53).  Past
    the bound, when the newest frame holds a step, the frames a match would never read (older
    than it and its look back) are forgotten without a match: none is searched for a NaN."""
    watcher, matcher, clock, posted = make()
    watcher("stdout", frame("step 1 loss 9.5\n"))
    matcher.calls = 0
    held = []
    for n in range(2, 2 + 4 * MATCH_BYTES // (256 * 1024)):  # at one instant: no match is due
        line = f"step {n} loss 2.0 " + "x" * 100 + "\n"
        watcher("stdout", frame(line * (256 * 1024 // len(line))))
        held.append(sum(f.nbytes for f in watcher._unmatched))
    assert max(held) < MATCH_BYTES
    # the newest frame and those next to it up to the look back: three of these
    assert min(held[MATCH_BYTES // (256 * 1024) :]) <= LOOK_BACK_BYTES + 2 * 256 * 1024
    assert matcher.calls == 0
    clock.now += STEP_POST_S
    watcher.flush()
    assert posted[-1].progress is not None and posted[-1].progress.step == n
    assert matcher.calls <= 3  # the newest frame, the one next to it: what a post reads


def test_a_flood_with_no_step_in_its_newest_frame_is_matched_not_forgotten() -> None:
    """A step, then more than the bound of other output: the waiting frames are matched, so
    the step they hold is not lost with them."""
    watcher, matcher, clock, posted = make()
    watcher("stdout", frame("step 1 loss 9.5\n"))
    watcher("stdout", frame("step 7 loss 1.25\n"))
    chatter = frame(("debug: tensor shapes " + "y" * 100 + "\n") * 2200)
    for _ in range(MATCH_BYTES // chatter.nbytes + 1):
        watcher("stdout", chatter)
    assert matcher.calls >= 2
    clock.now += STEP_POST_S
    watcher.flush()
    last = posted[-1].progress
    assert last is not None and (last.step, last.loss) == (7, 1.25)


def test_a_loss_next_to_a_floods_newest_step_is_kept_when_the_rest_is_forgotten() -> None:
    """Hugging Face's loss line at the end of one big frame, its step in the next (the newest):
    forgetting the unread frames keeps the one next to the step's, so the post has the loss."""
    watcher, _matcher, clock, posted = make()
    watcher("stdout", frame("step 1 loss 9.5\n"))
    filler = frame(("debug: " + "z" * 120 + "\n") * 4000)  # ~500 KiB: as a 512 KiB read
    for _ in range(MATCH_BYTES // filler.nbytes + 1):
        watcher("stdout", filler)
    watcher("stdout", frame(("debug: " + "z" * 120 + "\n") * 4000 + "{'loss': '0.375'}\n"))
    bar = "100%|##########| 10/10 [00:04<00:00,  4.47it/s]\n"
    watcher("stdout", frame(("debug: " + "z" * 120 + "\n") * 4000 + bar))
    clock.now += STEP_POST_S
    watcher.flush()
    last = posted[-1].progress
    assert last is not None and (last.step, last.loss) == (10, 0.375)


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


def test_a_floods_newest_loss_line_without_a_step_never_forgets_the_step_before_it() -> None:
    """The newest frame past the bound holds a loss but no step (Hugging Face's loss line):
    the waiting frames are matched, not forgotten, so the step before it is kept."""
    watcher, _matcher, clock, posted = make()
    watcher("stdout", frame("step 1 loss 9.5\n"))
    watcher("stdout", frame("step 7 loss 1.25\n"))
    chatter = frame(("debug: tensor shapes " + "y" * 100 + "\n") * 2200)
    for _ in range(MATCH_BYTES // chatter.nbytes):
        watcher("stdout", chatter)
    watcher("stdout", frame(("debug: " + "y" * 100 + "\n") * 2200 + "{'loss': '0.5'}\n"))
    clock.now += STEP_POST_S
    watcher.flush()
    last = posted[-1].progress
    assert last is not None and last.step == 7


def test_a_user_pattern_flood_forgets_only_behind_a_frame_its_pattern_finds_a_step_in() -> None:
    matcher = LineMatcher("", r"iter (\d+)", False)
    clock, posted = Clock(), []
    watcher = LineWatcher(1, matcher, clock, posted.append)
    watcher("stdout", frame("iter 1\n"))
    watcher("stdout", frame("iter 5\n"))
    chatter = frame(("no progress here " + "q" * 100 + "\n") * 5000)  # fewer than MATCH_BACK
    for _ in range(MATCH_BYTES // chatter.nbytes + 1):
        watcher("stdout", chatter)
    clock.now += STEP_POST_S
    watcher.flush()
    assert [seen.progress.step for seen in posted if seen.progress is not None][-1] == 5
