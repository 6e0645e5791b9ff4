"""A run's pace: its own step-time baseline, and whether it runs slow against it (issue 43).

Pure: each call takes the pace so far and one step interval and returns the next pace.  The
rule (docs/design.md, "Slow"):

- A *sample* is one interval between two progress events: its seconds per step (the
  interval over the steps it advanced; a job that logs every 50 steps gives one sample per
  50 steps).
- The first :data:`WARMUP_SAMPLES` samples after the first step are warm-up (compilation,
  caches, the data loader filling): never judged, never learnt from.
- The next :data:`BASELINE_SAMPLES` are learnt from: the baseline is their median, the run's
  own steady step time.  Nothing is judged before it.
- The run is *slow* when the median of its last :data:`WINDOW_SAMPLES` samples stays at least
  :data:`SLOW_FACTOR` times the baseline for :data:`SUSTAIN_S` seconds.  A median is unmoved
  by one long interval: an eval or a checkpoint pause between two steps is not a slowdown.
  It is *back* when that median falls below :data:`BACK_FACTOR` times the baseline.
- The time lost to slowness is the sum, over samples after the baseline, of each sample's
  excess over the baseline (seconds per step over the baseline, times its steps); a lone long
  interval while the pace is normal is a pause, not counted.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from typing import Final

WARMUP_SAMPLES: Final = 10
BASELINE_SAMPLES: Final = 20
WINDOW_SAMPLES: Final = 9
SLOW_FACTOR: Final = 1.2  # at least 20 % above the baseline...
SUSTAIN_S: Final = 20.0  # ...for this long
BACK_FACTOR: Final = 1.1  # below this: the cadence came back
PAUSE_FACTOR: Final = 5.0  # a lone interval this much above the baseline is a pause
PAUSES_KEPT: Final = 20


@dataclass(frozen=True, slots=True)
class Pace:
    """One run's pace (a value: :func:`paced` returns the next)."""

    samples: int = 0  # seconds-per-step samples seen since the first step
    learning: tuple[float, ...] = ()  # the samples the baseline is learnt from
    baseline_s: float | None = None  # seconds per step, once learnt
    recent: tuple[float, ...] = ()  # the last WINDOW_SAMPLES samples
    above_since: float | None = None  # monotonic: the recent median above the bar since then
    slow_since: float | None = None  # monotonic: the slow incident is open since then
    lost_s: float = 0.0  # time lost against the baseline (the ledger's slow bucket)
    worst_ratio: float = 0.0  # the highest recent median over the baseline while slow
    pauses: tuple[float, ...] = ()  # the last lone pauses' extra seconds (a checkpoint, an eval)

    @property
    def ratio(self) -> float | None:
        """The recent median over the baseline (None: no baseline yet)."""
        if self.baseline_s is None or not self.recent or self.baseline_s <= 0:
            return None
        return statistics.median(self.recent) / self.baseline_s

    @property
    def slow(self) -> bool:
        """The slow incident is open."""
        return self.slow_since is not None


@dataclass(frozen=True, slots=True)
class PaceChange:
    """What one sample changed: the baseline learnt, the incident opened or closed."""

    opened: bool = False
    closed: bool = False
    learnt: bool = False  # this sample completed the baseline (the run's own step time)


STEADY: Final = PaceChange()


def paced(pace: Pace, interval_s: float, steps: int, now: float) -> tuple[Pace, PaceChange]:
    """The pace after one interval of ``interval_s`` seconds that advanced ``steps`` steps."""
    if interval_s <= 0 or steps <= 0:
        return pace, STEADY
    per_step = interval_s / steps
    seen = pace.samples + 1
    if seen <= WARMUP_SAMPLES:
        return replace(pace, samples=seen), STEADY
    if pace.baseline_s is None:
        learning = (*pace.learning, per_step)
        baseline = statistics.median(learning) if len(learning) >= BASELINE_SAMPLES else None
        learnt = STEADY if baseline is None else PaceChange(learnt=True)
        return replace(pace, samples=seen, learning=learning, baseline_s=baseline), learnt
    base = pace.baseline_s
    recent = (*pace.recent, per_step)[-WINDOW_SAMPLES:]
    median = statistics.median(recent)
    ratio = median / base if base > 0 else 0.0
    excess = max(0.0, per_step - base) * steps
    lone_pause = ratio < SLOW_FACTOR and per_step >= PAUSE_FACTOR * base
    lost = pace.lost_s + (0.0 if lone_pause else excess)
    pauses = (*pace.pauses, excess)[-PAUSES_KEPT:] if lone_pause else pace.pauses
    nxt = replace(pace, samples=seen, recent=recent, lost_s=lost, pauses=pauses)
    if pace.slow_since is not None:
        nxt = replace(nxt, worst_ratio=max(pace.worst_ratio, ratio))
        if ratio < BACK_FACTOR:
            return replace(nxt, slow_since=None, above_since=None), PaceChange(closed=True)
        return nxt, STEADY
    if ratio < SLOW_FACTOR or len(recent) < WINDOW_SAMPLES:
        return replace(nxt, above_since=None), STEADY
    since = pace.above_since if pace.above_since is not None else now
    if now - since < SUSTAIN_S:
        return replace(nxt, above_since=since), STEADY
    opened = replace(nxt, above_since=since, slow_since=since, worst_ratio=ratio)
    return opened, PaceChange(opened=True)
