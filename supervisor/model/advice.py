"""The checkpoint interval that pays, from what the goodput ledger already knows (issue 43).

An estimate, labelled as one, with its inputs shown.  The model is Young's (1974) first-order
one, as Daly (2006) refined it for the optimum:

- the job fails every ``M`` seconds of work on average (the ledger's working time over its
  failures), and each failure costs ``R`` seconds to recover (start-up, detection, downtime);
- a checkpoint costs ``C`` seconds (the lone pauses between two steps the run's pace saw);
- with a checkpoint every ``T`` seconds a failure redoes ``T/2`` on average, so today's
  interval shows in the redone time: ``T_now = 2 x redone per failure``;
- the share of time wasted is ``C/T + (R + T/2)/M``; goodput is one minus it;
- the best interval is Daly's ``sqrt(2 C M) - C`` (Young's ``sqrt(2 C M)`` when ``C`` is small).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

MIN_FAILURES: Final = 2  # one failure says nothing of a rate
WORTH_RATIO: Final = 1.5  # said when the best interval differs from today's by this much...
WORTH_POINTS: Final = 0.02  # ...and lifts goodput by at least two points


@dataclass(frozen=True, slots=True)
class AdviceInputs:
    """What the estimate is made from (seconds)."""

    failures: int
    working_s: float  # wall time, less stopped time
    recovery_s: float  # start-up, detection and downtime, all failures together
    redone_s: float  # steps redone after failures, together
    checkpoint_cost_s: float | None  # one checkpoint (None: never seen)


@dataclass(frozen=True, slots=True)
class Advice:
    """The estimate: today's interval and goodput, the best interval and its goodput."""

    mtbf_s: float
    recovery_s: float  # per failure
    checkpoint_cost_s: float
    interval_now_s: float
    interval_best_s: float
    goodput_now: float
    goodput_best: float

    @property
    def worth_saying(self) -> bool:
        """The best interval differs much from today's, and pays."""
        ratio = max(self.interval_now_s, self.interval_best_s) / max(
            min(self.interval_now_s, self.interval_best_s), 1e-9
        )
        return ratio >= WORTH_RATIO and self.goodput_best - self.goodput_now >= WORTH_POINTS


def goodput_at(interval_s: float, *, cost_s: float, mtbf_s: float, recovery_s: float) -> float:
    """The goodput a checkpoint every ``interval_s`` gives (Young's first-order model)."""
    if interval_s <= 0 or mtbf_s <= 0:
        return 0.0
    waste = cost_s / interval_s + (recovery_s + interval_s / 2) / mtbf_s
    return max(0.0, 1.0 - waste)


def best_interval(*, cost_s: float, mtbf_s: float) -> float:
    """Daly's optimum (Young's when the checkpoint is cheap), never below the cost itself."""
    if cost_s >= mtbf_s / 2:
        return mtbf_s
    return max(cost_s, math.sqrt(2 * cost_s * mtbf_s) - cost_s)


def advise(given: AdviceInputs) -> Advice | None:
    """The estimate, or None when the ledger cannot support one (too few failures, no redone
    steps to show today's interval, no checkpoint seen)."""
    cost = given.checkpoint_cost_s
    if given.failures < MIN_FAILURES or given.redone_s <= 0 or cost is None or cost <= 0:
        return None
    mtbf = given.working_s / given.failures
    recovery = given.recovery_s / given.failures
    now = 2 * given.redone_s / given.failures
    best = best_interval(cost_s=cost, mtbf_s=mtbf)
    return Advice(
        mtbf_s=mtbf,
        recovery_s=recovery,
        checkpoint_cost_s=cost,
        interval_now_s=now,
        interval_best_s=best,
        goodput_now=goodput_at(now, cost_s=cost, mtbf_s=mtbf, recovery_s=recovery),
        goodput_best=goodput_at(best, cost_s=cost, mtbf_s=mtbf, recovery_s=recovery),
    )


def said(given: AdviceInputs) -> dict[str, Any] | None:
    """What status and the report say (``estimate``, ``text``, ``inputs``), or None when the
    estimate cannot be made or the interval today is near enough the best."""
    advice = advise(given)
    if advice is None or not advice.worth_saying:
        return None
    text = (
        f"checkpointing every {_minutes(advice.interval_best_s)} instead of "
        f"{_minutes(advice.interval_now_s)} would lift goodput from "
        f"{advice.goodput_now:.0%} to {advice.goodput_best:.0%} (an estimate)"
    )
    inputs = {
        "failures": given.failures,
        "mtbf_s": round(advice.mtbf_s, 1),
        "recovery_s_per_failure": round(advice.recovery_s, 1),
        "redone_s_per_failure": round(given.redone_s / given.failures, 1),
        "checkpoint_cost_s": round(advice.checkpoint_cost_s, 2),
    }
    return {"estimate": True, "text": text, "inputs": inputs}


def checkpoint_cost(pauses: Sequence[float]) -> float | None:
    """A checkpoint's cost: the median of the pauses seen between steps (None: none seen)."""
    return statistics.median(pauses) if pauses else None


def _minutes(seconds: float) -> str:
    """``12 min``, ``1.5 h``, ``40 s``: the words of the advice."""
    if seconds >= 5400:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 90:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"
