"""Goodput: where the machine's time went, from the facts dflashd already has (pure).

Every second since the home's first start is settled into exactly one bucket:

- ``productive``: a run making new progress (steps beyond the best any earlier run reached);
- ``startup``: launch -> first step (imports, compiles, data loading);
- ``redone``: a relaunched run repeating steps (its first step -> the step past the
  previous best), at the job's own pace;
- ``detection``: the last progress -> the death (about 0 for a crash, the wait for a hang);
- ``downtime``: the death -> the next launch (backoff, GPU release, leftovers, a dead daemon);
- ``slow``: stepping, but slower than the run's own baseline (model/pace.py);
- ``stopped``: a ``stop``, a completion, a fatal end, until the next ``start``.

A live run's time since its last progress is settled by what comes next (a step:
productive; its death: detection): every total only grows, and ``wall_s`` is their sum.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any, Final, TypedDict

CAUSES: Final = ("startup", "detection", "downtime", "redone", "slow")


class LostView(TypedDict):
    """Seconds lost, by cause."""

    startup: float
    detection: float
    downtime: float
    redone: float
    slow: float


class GoodputView(TypedDict):
    """``status --json``'s ``goodput`` object (docs/design.md, "Goodput")."""

    ratio: float | None  # productive / (wall - stopped); None before anything is settled
    wall_s: float
    stopped_s: float
    productive_s: float
    lost_s: LostView


@dataclass(frozen=True, slots=True)
class Cost:
    """Seconds of one stretch (a run, a gap between runs), by bucket."""

    productive_s: float = 0.0
    startup_s: float = 0.0
    detection_s: float = 0.0
    downtime_s: float = 0.0
    redone_s: float = 0.0
    slow_s: float = 0.0  # stepping, but slower than the run's own baseline (issue 43)
    stopped_s: float = 0.0

    def __add__(self, other: Cost) -> Cost:
        return Cost(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(Cost)))

    @property
    def total_s(self) -> float:
        """Every bucket together."""
        return float(sum(getattr(self, f.name) for f in fields(Cost)))

    def record(self) -> dict[str, float]:
        """The buckets that are not zero, rounded, for a record (``exit``'s ``cost``)."""
        out = {f.name: round(getattr(self, f.name), 3) for f in fields(Cost)}
        return {k: v for k, v in out.items() if v}


NOTHING: Final = Cost()


@dataclass(frozen=True, slots=True)
class Recovery:
    """A restart inside one run that its launcher handled itself (torchrun's ``--max-restarts``):
    the last step before the failure, the failure, the first step after it, and when the run
    passed its best step before the failure again (monotonic; None: not yet)."""

    last_step: float
    failed: float
    resumed: float | None = None
    passed: float | None = None


@dataclass(frozen=True, slots=True)
class RunTimes:
    """One run's moments (monotonic seconds), as its progress saw them."""

    launched: float
    first_step: float | None = None
    last_progress: float | None = None
    best_before: int | None = None  # the best step of every earlier run (None: none had one)
    passed_best: float | None = None  # when it first reported a step beyond ``best_before``
    stepped: bool = False  # it reported step numbers (only then can steps be redone)
    recoveries: tuple[Recovery, ...] = ()  # restarts inside the run (torchrun's own)
    slow_s: float = 0.0  # stepping time lost against the run's own baseline (model/pace.py)


def run_cost(
    times: RunTimes,
    until: float,
    *,
    ended: bool,
    completed: bool = False,
    stop_at: float | None = None,
) -> Cost:
    """The settled cost of a run up to ``until`` (its death when ``ended``).

    A live run's time past its last progress is left unsettled.  A run that ended owes its
    tail (the last progress -> its death) to detection, or to productive when it completed.
    Time after ``stop_at`` (a user's stop) is stopped, whatever the run did.
    """
    until = max(until, times.launched)
    cut = until if stop_at is None else max(times.launched, min(until, stop_at))
    stopped = until - cut if ended or stop_at is not None else 0.0
    if times.first_step is None or times.first_step >= cut:
        return Cost(startup_s=cut - times.launched, stopped_s=stopped)
    startup = times.first_step - times.launched
    moving_end = min(max(times.last_progress or times.first_step, times.first_step), cut)
    redoing = times.stepped and times.best_before is not None
    if not redoing:
        redone, productive = 0.0, moving_end - times.first_step
    elif times.passed_best is None or times.passed_best >= moving_end:
        redone, productive = moving_end - times.first_step, 0.0
    else:
        passed = max(times.passed_best, times.first_step)
        redone, productive = passed - times.first_step, moving_end - passed
    inner = _inner_restarts(times, productive_from=moving_end - productive, until=moving_end)
    tail = cut - moving_end if ended or stop_at is not None else 0.0
    if completed or stop_at is not None:
        productive += tail  # a completed run's last save, or a healthy run up to the stop
        tail = 0.0
    productive -= inner.total_s
    slow = min(max(0.0, times.slow_s), max(0.0, productive))  # the slowness, out of productive
    return Cost(
        productive_s=productive - slow,
        startup_s=startup,
        redone_s=redone + inner.redone_s,
        slow_s=slow,
        detection_s=tail + inner.detection_s,
        downtime_s=inner.downtime_s,
        stopped_s=stopped,
    )


def _overlap(start: float, end: float, lo: float, hi: float) -> float:
    return max(0.0, min(end, hi) - max(start, lo))


def _inner_restarts(times: RunTimes, *, productive_from: float, until: float) -> Cost:
    """The part of a run's productive stretch ``[productive_from, until]`` that its own
    restarts cost: the last step -> the failure is detection, the failure -> the first step
    after it downtime, and that step -> passing the old best redone (each ends at the next
    failure at the latest)."""
    cost = NOTHING
    recoveries = times.recoveries
    for index, rec in enumerate(recoveries):
        end = recoveries[index + 1].last_step if index + 1 < len(recoveries) else until
        resumed = min(rec.resumed if rec.resumed is not None else end, end)
        passed = min(rec.passed if rec.passed is not None else end, end)
        cost += Cost(
            detection_s=_overlap(rec.last_step, rec.failed, productive_from, until),
            downtime_s=_overlap(rec.failed, resumed, productive_from, until),
            redone_s=_overlap(resumed, passed, productive_from, until),
        )
    return cost


def gap_cost(since: float, until: float, *, wanted: bool) -> Cost:
    """A stretch with no run alive: downtime when a relaunch is wanted, else stopped."""
    span = max(0.0, until - since)
    return Cost(downtime_s=span) if wanted else Cost(stopped_s=span)


@dataclass(frozen=True, slots=True)
class GoodputLedger:
    """The settled totals, and the stretch now open: a run, or the gap before the next one.

    A value: :meth:`launched`, :meth:`ended` and :meth:`stopping` return the next ledger
    (the model's ``step`` keeps it); :meth:`view` adds the open stretch up to ``now``.
    """

    first_start: float  # wall clock of the home's first start
    closed: Cost = NOTHING
    gap_since: float | None = None  # monotonic: no run alive since then
    gap_wanted: bool = True  # a relaunch is wanted: the gap is downtime
    stop_at: float | None = None  # monotonic: a user's stop
    carried_best: int | None = None  # the best step before a daemon died (its relaunch redoes)
    absent: Cost = NOTHING  # the time no daemon was here, counted at this daemon's start

    def best_before(self, policy_best: int | None) -> int | None:
        """The best step a new run must pass to make new progress."""
        known = [b for b in (policy_best, self.carried_best) if b is not None]
        return max(known) if known else None

    def downtime_s(self, now: float) -> float | None:
        """The downtime a launch at ``now`` would close (None: no gap open, or not downtime)."""
        if self.gap_since is None or not self.gap_wanted:
            return None
        return max(0.0, now - self.gap_since)

    def launched(self, now: float) -> GoodputLedger:
        """A run starts: the gap before it closes (:meth:`downtime_s` said how much was downtime)."""
        closed = self.closed
        if self.gap_since is not None:
            closed = closed + gap_cost(self.gap_since, now, wanted=self.gap_wanted)
        return replace(self, closed=closed, gap_since=None, gap_wanted=True)

    def ended(self, cost: Cost, now: float, *, relaunch: bool) -> GoodputLedger:
        """A run ended costing ``cost``; the gap that follows is downtime if a run follows."""
        wanted = relaunch and self.stop_at is None
        return replace(self, closed=self.closed + cost, gap_since=now, gap_wanted=wanted)

    def stopping(self, now: float) -> GoodputLedger:
        """The user asked to stop: from now on, time is stopped time."""
        if self.stop_at is not None:
            return self
        if self.gap_since is not None and self.gap_wanted:
            closed = self.closed + gap_cost(self.gap_since, now, wanted=True)
            return replace(self, stop_at=now, closed=closed, gap_since=now, gap_wanted=False)
        return replace(self, stop_at=now)

    def settled(self, live: RunTimes | None, now: float) -> Cost:
        """Everything settled up to ``now``: the closed stretches and the open one."""
        if live is not None:
            return self.closed + run_cost(live, now, ended=False, stop_at=self.stop_at)
        if self.gap_since is not None:
            return self.closed + gap_cost(self.gap_since, now, wanted=self.gap_wanted)
        return self.closed

    def view(self, live: RunTimes | None, now: float) -> GoodputView:
        """The ``goodput`` object of status."""
        return goodput_view(self.settled(live, now))


def goodput_view(total: Cost) -> GoodputView:
    """The status object for settled totals."""
    wall = total.total_s
    working = wall - total.stopped_s
    return {
        "ratio": round(total.productive_s / working, 6) if working > 0 else None,
        "wall_s": round(wall, 3),
        "stopped_s": round(total.stopped_s, 3),
        "productive_s": round(total.productive_s, 3),
        "lost_s": {
            "startup": round(total.startup_s, 3),
            "detection": round(total.detection_s, 3),
            "downtime": round(total.downtime_s, 3),
            "redone": round(total.redone_s, 3),
            "slow": round(total.slow_s, 3),
        },
    }


# -- persistence: one row of runs.sqlite, read back by a later daemon ----------------------

MAX_SECONDS: Final = 1e12  # beyond 30,000 years a stored total is not one


def cost_to_json(cost: Cost) -> dict[str, float]:
    """The totals as stored."""
    return {f.name: getattr(cost, f.name) for f in fields(Cost)}


def cost_from_json(obj: Any) -> Cost:
    """Stored totals, each a finite non-negative number or 0 (never raises)."""
    if not isinstance(obj, dict):
        return NOTHING
    values: dict[str, float] = {}
    for f in fields(Cost):
        value = obj.get(f.name)
        number = 0.0
        if isinstance(value, int | float) and not isinstance(value, bool):
            number = float(value) if -1 < value <= MAX_SECONDS else 0.0  # a 10**5000 int too
        values[f.name] = number if 0 <= number <= MAX_SECONDS else 0.0  # NaN fails too
    return Cost(**values)


@dataclass(frozen=True, slots=True)
class LoggedRun:
    """What the run log says of the run a killed daemon left (wall clock): when it reached
    its first step, and the last time it made progress (a step line, a notify, a record)."""

    first_step: float | None
    last_progress: float | None


def caught_up(settled_until: float, logged: LoggedRun | None) -> Cost:
    """The stretch a killed daemon had not saved: from where its saved totals end
    (``settled_until``, wall) to the run's last logged progress.  Before the first step it
    was start-up, after it new progress.  Nothing when the log holds no later progress."""
    if logged is None or logged.last_progress is None:
        return NOTHING
    end = min(logged.last_progress, settled_until + MAX_SECONDS)
    if end <= settled_until:
        return NOTHING
    first = logged.first_step
    if first is None or first >= end:
        return Cost(startup_s=end - settled_until)
    startup = max(0.0, first - settled_until)
    return Cost(startup_s=startup, productive_s=end - max(first, settled_until))


def restored_ledger(
    saved: tuple[float, Any, bool] | None,
    *,
    now_wall: float,
    now_mono: float,
    logged: LoggedRun | None = None,
) -> GoodputLedger:
    """The ledger a daemon starts with: a new one, or the saved one carried to now.

    After a daemon that died with its run, what the log shows that run did after the last
    save (``logged``) is settled as it would have been: no total ever goes back."""
    if saved is None or not math.isfinite(saved[0]) or not 0 < saved[0] <= now_wall:
        return GoodputLedger(first_start=now_wall, gap_since=now_mono)
    first_start, totals, daemon_ended = saved
    before = cost_from_json(totals)
    if not daemon_ended:
        before = before + caught_up(first_start + before.total_s, logged)
    away = absence(first_start, before, daemon_ended=daemon_ended, now_wall=now_wall)
    best = totals.get("best_step") if isinstance(totals, dict) else None
    carried = None  # a daemon that ended: the next start may be a new job; one that died: not
    if not daemon_ended and isinstance(best, int) and not isinstance(best, bool):
        carried = best if 0 <= best < 2**53 else None
    return GoodputLedger(
        first_start=first_start,
        closed=before + away,
        gap_since=now_mono,
        carried_best=carried,
        absent=away,
    )


def absence(first_start: float, saved: Cost, *, daemon_ended: bool, now_wall: float) -> Cost:
    """The time no daemon was here, from the last settled moment to ``now_wall``: stopped after
    a daemon that ended (a stop, a completion, a fatal end), downtime after one that died with
    its job (killed, a reboot)."""
    settled_until = first_start + saved.total_s
    gap = max(0.0, min(now_wall - settled_until, MAX_SECONDS))
    return Cost(stopped_s=gap) if daemon_ended else Cost(downtime_s=gap)


def view_from_json(obj: Any) -> GoodputView | None:
    """A ``goodput`` object read back (state.json): well-typed, or None (never raises)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("lost_s"), dict):
        return None
    lost = obj["lost_s"]
    total = cost_from_json(
        {
            "productive_s": obj.get("productive_s"),
            "stopped_s": obj.get("stopped_s"),
            **{f"{cause}_s": lost.get(cause) for cause in CAUSES},
        }
    )
    return goodput_view(total)


# -- the words people read ------------------------------------------------------------------


def duration_text(seconds: float) -> str:
    """``3h12m``, ``7m02s``, ``41s``: short, and exact enough to compare causes."""
    s = round(max(0.0, seconds))
    if s >= 86400:
        return f"{s // 86400}d{s % 86400 // 3600:02d}h"
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def lost_seconds(view: GoodputView) -> dict[str, float]:
    """The lost seconds by cause, in :data:`CAUSES` order."""
    lost = view["lost_s"]
    seconds = (lost["startup"], lost["detection"], lost["downtime"], lost["redone"])
    return dict(zip(CAUSES, (*seconds, lost.get("slow", 0.0)), strict=True))


def goodput_line(view: GoodputView) -> str:
    """``goodput 96.1 % of 3h12m  (lost: redone 7m02s, startup 3m10s, downtime 41s, detection 0s)``."""
    working = view["wall_s"] - view["stopped_s"]
    ratio = view["ratio"]
    share = "—" if ratio is None else f"{ratio * 100:.1f} %"
    shown = [(c, s) for c, s in lost_seconds(view).items() if c != "slow" or s >= 1]  # when seen
    lost = sorted(shown, key=lambda kv: (-kv[1], CAUSES.index(kv[0])))
    parts = ", ".join(f"{cause} {duration_text(s)}" for cause, s in lost)
    line = f"goodput {share} of {duration_text(working)}  (lost: {parts})"
    if view["stopped_s"] >= 1:
        line += f"; stopped {duration_text(view['stopped_s'])}"
    return line
