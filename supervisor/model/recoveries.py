"""One recovery, split (issue 51): where the seconds between a run's last progress and its
relaunch passing the old best step went, so a user sees what a faster decision and a warm
start bought (pure).

- ``detection``: the dead run's last progress -> its death (a hang's wait; about 0 for a crash);
- ``teardown``: its death -> the relaunch (the kill, the backoff, the GPU release, the pre-flight);
- ``start``: the relaunch -> its first step, ``warm`` (the standby interpreter) or ``cold``;
- ``redone``: its first step -> the step past the old best, in steps and seconds.

The same seconds are in the goodput ledger's buckets (model/goodput.py); this is one
recovery's share of them, in the order a user lived them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from dflashd.supervisor.model.runstate import RunState

# A run after one of these was started by a user, not relaunched after a failure.
NOT_FAILURES: Final = frozenset({"completed", "stopped"})


@dataclass(frozen=True, slots=True)
class RecoverySplit:
    """One relaunch's seconds, by part; ``None``: that part has not happened yet."""

    run: int  # the relaunched run
    after: str  # the verdict of the run it replaced
    detection_s: float
    teardown_s: float
    start: str  # "warm" or "cold"
    start_s: float | None
    redone_steps: int | None
    redone_s: float | None
    back: bool  # it passed the old best step: the recovery is over

    @property
    def total_s(self) -> float:
        """Every part so far."""
        parts = (self.detection_s, self.teardown_s, self.start_s or 0.0, self.redone_s or 0.0)
        return sum(parts)

    def view(self) -> dict[str, Any]:
        """``status --json``'s ``recovery`` object."""

        def seconds(value: float | None) -> float | None:
            return None if value is None else round(value, 3)

        return {
            "run": self.run,
            "after": self.after,
            "detection_s": seconds(self.detection_s),
            "teardown_s": seconds(self.teardown_s),
            "start": self.start,
            "start_s": seconds(self.start_s),
            "redone_steps": self.redone_steps,
            "redone_s": seconds(self.redone_s),
            "total_s": seconds(self.total_s),
            "back": self.back,
        }


def _seconds(value: Any) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    return max(0.0, float(value)) if ok else 0.0


def recovery_split(
    last_exit: Mapping[str, Any] | None, run: RunState | None, now: float
) -> RecoverySplit | None:
    """The live run's recovery from the run before it (``last_exit``, as the ledger keeps it),
    or None: no live relaunch, or the run before it did not fail (a user's start)."""
    if run is None or not last_exit or run.spawn_error is not None:
        return None
    before, verdict = last_exit.get("run"), str(last_exit.get("verdict") or "")
    if not isinstance(before, int) or before >= run.run_no or verdict in NOT_FAILURES:
        return None
    cost = last_exit.get("cost")
    cost = cost if isinstance(cost, Mapping) else {}
    ended_at = last_exit.get("ended_at")
    teardown = run.started_wall - ended_at if isinstance(ended_at, int | float) else 0.0
    p = run.progress
    first = p.first_step_mono
    start_s = None if first is None else max(0.0, first - run.started_mono)
    redone_steps = redone_s = None
    back = first is not None and (p.best_before is None or p.passed_best_mono is not None)
    if first is not None and p.best_before is not None and p.first_step_no is not None:
        top = p.top_step if p.top_step is not None else p.first_step_no
        redone_steps = max(0, min(top, p.best_before) - p.first_step_no + 1)
        until = p.passed_best_mono if p.passed_best_mono is not None else now
        redone_s = max(0.0, until - first)
    return RecoverySplit(
        run=run.run_no,
        after=verdict,
        detection_s=_seconds(cost.get("detection_s")),
        teardown_s=_seconds(teardown),
        start=run.start,
        start_s=start_s,
        redone_steps=redone_steps,
        redone_s=redone_s,
        back=back,
    )
