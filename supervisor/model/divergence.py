"""Whether a run's loss diverged (issue 43): pure, one loss at a time.

The rule (docs/design.md, "Diverged"):

- A loss that is NaN or infinite is out of range.  :data:`STAY_NONFINITE` of them in a row
  (none finite between) is a divergence: a NaN that stays.  One now and then is a loss
  scaler's skipped step (fp16/bf16: the scale halves and the next loss is finite again), and a
  finite loss after it, in range, ends the streak.
- After :data:`WARMUP_LOSSES` losses (the first ones fall fast and say little), each loss is
  judged against the range of the last :data:`WINDOW_LOSSES` losses that were in range: it is
  *out* when it is above the range's top by more than :data:`OUT_SPREADS` times the range's
  spread (its top minus its bottom; at least :data:`MIN_SPREAD_SHARE` of its median's size).
- Out :data:`STAY_OUT` times in a row, with none back in range between, is a divergence; it
  began at the first of them, and the last good step is the one before.  A spike that comes
  back is no divergence, and a loss that falls fast is never out (only a rise is).

On real curves (nanoGPT, torchtitan, Hugging Face, Lightning and the bundled trainer's, a
noisy small-batch curve) the window's own noise sets the bar, so it stays silent; a loss
that goes from 2 to 40 and stays there is caught after :data:`STAY_OUT` logged losses.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace
from typing import Final

WARMUP_LOSSES: Final = 10
WINDOW_LOSSES: Final = 50
OUT_SPREADS: Final = 3.0
MIN_SPREAD_SHARE: Final = 0.1
STAY_OUT: Final = 5
# A NaN that stays: three logged losses in a row.  A loss scaler skips one step (now and then
# a handful), the finite loss after it ends the streak; a job that logs every step a second
# is judged in 2-3 s.
STAY_NONFINITE: Final = 3


@dataclass(frozen=True, slots=True)
class LossWatch:
    """One run's losses as the rule sees them (a value: :func:`watched` returns the next)."""

    seen: int = 0
    window: tuple[float, ...] = ()  # the last in-range losses
    out: int = 0  # losses out of range in a row
    out_since: int | None = None  # the step of the first of them
    nonfinite: int = 0  # NaN/infinite losses in a row
    last_good_step: int | None = None
    diverged_at: int | None = None  # the step where the divergence began (once, then kept)
    why: str | None = None
    last_step: int | None = None  # the step of the last loss judged (a line seen again is not)

    @property
    def diverged(self) -> bool:
        """The loss diverged."""
        return self.why is not None


def bar(window: tuple[float, ...]) -> float:
    """The level above which a loss is out of the window's range."""
    top, bottom = max(window), min(window)
    spread = max(top - bottom, MIN_SPREAD_SHARE * abs(statistics.median(window)), 1e-9)
    return top + OUT_SPREADS * spread


def watched(watch: LossWatch, loss: float, step: int | None) -> tuple[LossWatch, bool]:
    """The watch after one logged loss; True when this loss made it diverge."""
    if watch.diverged or (step is not None and step == watch.last_step):
        return watch, False
    watch = replace(watch, last_step=step)
    if not math.isfinite(loss):
        return _nonfinite(watch, loss, step)
    watch = replace(watch, nonfinite=0)
    seen = watch.seen + 1
    if seen <= WARMUP_LOSSES or len(watch.window) < WARMUP_LOSSES:
        window = (*watch.window, loss)[-WINDOW_LOSSES:]
        warm = replace(watch, seen=seen, window=window, out=0, out_since=None)
        return replace(warm, last_good_step=step), False
    level = bar(watch.window)
    if loss <= level:
        window = (*watch.window, loss)[-WINDOW_LOSSES:]
        back = replace(watch, seen=seen, window=window, out=0, out_since=None)
        return replace(back, last_good_step=step), False
    out = watch.out + 1
    since = watch.out_since if watch.out_since is not None else step
    nxt = replace(watch, seen=seen, out=out, out_since=since)
    if out < STAY_OUT:
        return nxt, False
    why = (
        f"the loss left its range ({min(watch.window):.4g}..{max(watch.window):.4g}) at step "
        f"{since} and stayed out for {out} logged losses (now {loss:.4g}, the bar {level:.4g})"
    )
    return replace(nxt, diverged_at=since, why=why), True


def _nonfinite(watch: LossWatch, loss: float, step: int | None) -> tuple[LossWatch, bool]:
    """A NaN or an infinite loss: out of range, and a divergence once it stays."""
    since = watch.out_since if watch.out_since is not None else step
    streak = watch.nonfinite + 1
    nxt = replace(watch, out=watch.out + 1, out_since=since, nonfinite=streak)
    if streak < STAY_NONFINITE and nxt.out < STAY_OUT:
        return nxt, False
    why = (
        f"the loss is {loss} at step {step}, non-finite for {streak} logged losses in a row"
        if streak >= STAY_NONFINITE
        else f"the loss left its range at step {since} and stayed out for {nxt.out} logged "
        f"losses (now {loss})"
    )
    return replace(nxt, diverged_at=since, why=why), True
