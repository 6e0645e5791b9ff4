"""The report's data: the run log folded into runs, steps, losses, GPU memory and goodput.

Pure functions of the supervisor's records (child lines are ignored); ``htmlreport`` draws
them, ``runtable`` lists them.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

from dflashd.logs.records import EventRecord, Record, parse_timestamp
from dflashd.supervisor.client.goodputhtml import GoodputData
from dflashd.supervisor.model.events import Event
from dflashd.supervisor.model.lifecycle import State
from dflashd.supervisor.model.rules import rule_named
from dflashd.supervisor.model.verdicts import Verdict

# One colour per verdict, used by the table, the timeline and the step and loss lines alike:
# a colour says how a run ended (green completed, red crashed, grey stopped, blue running),
# never which run it was; the run's number is its row and its label (runs never overlap).
VERDICT_COLORS: Final[dict[str, str]] = {
    Verdict.COMPLETED: "#2e7d32",
    Verdict.STOPPED: "#757575",
    Verdict.CRASHED: "#c62828",
    Verdict.STALLED: "#ef6c00",
    Verdict.RENDEZVOUS_TIMEOUT: "#f9a825",
    Verdict.CRASH_BEFORE_FIRST_STEP: "#ad1457",
    Verdict.SILENT_DEATH: "#6a1b9a",
    Verdict.NO_GPU_MEMORY: "#283593",
    Verdict.SPAWN_FAILED: "#000000",
    Verdict.LOST: "#8d6e63",
    Verdict.DIVERGED: "#4e342e",
    State.RUNNING: "#1565c0",  # a run still running has no verdict yet
}
_OTHER_COLOR: Final = "#424242"


@dataclass
class RunSpan:
    """One run: when it started and ended, how, and its step at the end."""

    run: int
    start: float
    end: float | None = None
    verdict: str = "running"
    reason: str = ""
    first_step_at: float | None = None
    last_step: int | None = None
    argv: list[str] = field(default_factory=list)
    cwd: str = ""
    tail: list[str] = field(default_factory=list)  # the exit record's last output lines
    start_kind: str = ""  # "warm" (the standby interpreter) or "cold", as its spawn record says
    first_step: int | None = None  # the first step number it reported
    top_step: int | None = None  # the highest

    @property
    def command(self) -> str:
        """The launched command, as a shell would take it."""
        return shlex.join(self.argv)

    @property
    def error(self) -> str:
        """The run's last output line when it failed (its error text), else empty."""
        failed = self.verdict not in (Verdict.COMPLETED, Verdict.STOPPED, State.RUNNING)
        last = next((line for line in reversed(self.tail) if line.strip()), "")
        return last.strip() if failed else ""


@dataclass
class ReportData:
    """What the charts need."""

    runs: dict[int, RunSpan] = field(default_factory=dict)
    steps: list[tuple[float, int, int]] = field(default_factory=list)  # (time, run, step)
    gpu_memory: dict[int, list[tuple[float, float]]] = field(
        default_factory=dict
    )  # gpu -> (time, MiB)
    gpu_total: dict[int, float] = field(default_factory=dict)
    fatal: list[tuple[float, int, str]] = field(default_factory=list)  # (time, run, reason)
    losses: list[tuple[float, int, float]] = field(default_factory=list)  # (time, run, loss)
    dumps: list[tuple[float, int, str, str]] = field(default_factory=list)  # (time, run, why, file)
    # (time, run, step, last good step): a run's loss diverged (model/divergence.py)
    diverged: list[tuple[float, int, int | None, int | None]] = field(default_factory=list)
    goodput: GoodputData = field(default_factory=GoodputData)

    def stepped(self, at: float, run: int, step: int) -> None:
        """A step the run reported (a point of the step chart; its first and highest kept)."""
        self.steps.append((at, run, step))
        span = self.runs.get(run)
        if span is not None:
            span.first_step = step if span.first_step is None else span.first_step
            span.top_step = step if span.top_step is None else max(span.top_step, step)

    def redone_steps(self, run: int) -> int | None:
        """Steps the run did again up to the best step of the runs before it (None: it
        stepped first, or reported no step numbers)."""
        span = self.runs.get(run)
        earlier = [r.top_step for n, r in self.runs.items() if n < run and r.top_step is not None]
        if span is None or span.first_step is None or span.top_step is None or not earlier:
            return None
        return max(0, min(span.top_step, max(earlier)) - span.first_step + 1)

    def color(self, run: int) -> str:
        """A run's colour in every chart: its verdict's (a run still without an exit record:
        running's blue)."""
        span = self.runs.get(run)
        return verdict_color(self.verdict_of(span) if span is not None else State.RUNNING)

    def verdict_of(self, span: RunSpan) -> str:
        """The run's verdict as the page says it: a run with no exit record is running while
        a daemon holds the home, else its end was never written ("no exit record")."""
        if span.end is not None:
            return span.verdict
        return State.RUNNING if self.goodput.live_until is not None else "no exit record"

    @property
    def span(self) -> tuple[float, float]:
        times = [r.start for r in self.runs.values()] + [r.end for r in self.runs.values() if r.end]
        times += [t for t, _, _ in self.steps] + [
            t for pts in self.gpu_memory.values() for t, _ in pts
        ]
        if not times:
            return 0.0, 1.0
        lo, hi = min(times), max(times)
        return lo, hi if hi > lo else lo + 1.0


def verdict_color(verdict: str) -> str:
    """A verdict's colour, the same in the table, the timeline and the lines."""
    rule = rule_named(verdict)
    return VERDICT_COLORS.get(verdict, rule.html_colour if rule is not None else _OTHER_COLOR)


def collect(records: Iterable[Record], only_runs: set[int] | None = None) -> ReportData:
    """Fold supervisor records into report data (child lines are ignored)."""
    data = ReportData()
    for rec in records:
        if not isinstance(rec, EventRecord) or (only_runs is not None and rec.run not in only_runs):
            continue
        at = parse_timestamp(rec.ts)
        fields = rec.fields
        data.goodput.take(rec.event, rec.run, at, fields)
        if rec.event == Event.SPAWN:
            argv = fields.get("argv")
            data.runs[rec.run] = RunSpan(
                rec.run,
                at,
                argv=[str(a) for a in argv] if isinstance(argv, list) else [],
                cwd=str(fields.get("cwd") or ""),
                start_kind=str(fields.get("start") or ""),
            )
        elif rec.event == Event.FIRST_STEP and rec.run in data.runs:
            data.runs[rec.run].first_step_at = at
            if isinstance(fields.get("step"), int):
                data.stepped(at, rec.run, fields["step"])
        elif rec.event == Event.PROGRESS:
            if isinstance(fields.get("step"), int):
                data.stepped(at, rec.run, fields["step"])
            if isinstance(fields.get("loss"), int | float):
                data.losses.append((at, rec.run, float(fields["loss"])))
        elif rec.event == Event.EXIT and rec.run in data.runs:
            span = data.runs[rec.run]
            span.end, span.verdict, span.reason = (
                at,
                str(fields.get("verdict")),
                str(fields.get("reason")),
            )
            tail = fields.get("tail")
            span.tail = [str(line) for line in tail] if isinstance(tail, list) else []
            if isinstance(fields.get("step"), int):
                span.last_step = fields["step"]
                data.stepped(at, rec.run, fields["step"])
        elif rec.event in (Event.GPU, Event.GPU_SNAPSHOT):
            for gpu in fields.get("gpus") or []:
                if gpu.get("memory_used_mib") is None or not isinstance(gpu.get("index"), int):
                    continue
                data.gpu_memory.setdefault(gpu["index"], []).append(
                    (at, float(gpu["memory_used_mib"]))
                )
                if gpu.get("memory_total_mib"):
                    data.gpu_total[gpu["index"]] = float(gpu["memory_total_mib"])
        elif rec.event == Event.FATAL:
            data.fatal.append((at, rec.run, str(fields.get("reason"))))
        elif rec.event == Event.DIVERGED:
            step, good = fields.get("step"), fields.get("last_good_step")
            data.diverged.append(
                (
                    at,
                    rec.run,
                    step if isinstance(step, int) else None,
                    good if isinstance(good, int) else None,
                )
            )
        elif rec.event == Event.STACKS and isinstance(fields.get("path"), str):
            data.dumps.append((at, rec.run, str(fields.get("trigger")), fields["path"]))
    return data


def diverged_text(step: int | None, last_good: int | None) -> str:
    """``loss diverged at step 60 (last good step 59)``."""
    where = f" at step {step}" if step is not None else ""
    good = f" (last good step {last_good})" if last_good is not None else ""
    return f"loss diverged{where}{good}"
