"""What a run's pace and loss say, as effects: a slow incident opened or closed, a divergence
(issue 43).  The rules are pure (:mod:`~dflashd.supervisor.model.pace`,
:mod:`~dflashd.supervisor.model.divergence`); the causes are judged by :mod:`slowness`.
Slowness is never a reason to end a run; a divergence ends it only with ``on_diverge =
"stop"``, or when a relaunch diverges again at the step the last one did.
"""

from __future__ import annotations

from typing import Any, Final

from dflashd.supervisor.model.effects import DumpStacks, Effect, SendAlert, WriteRecord
from dflashd.supervisor.model.events import Event
from dflashd.supervisor.model.verdicts import EndedBy, Notice, Verdict
from dflashd.supervisor.watch.nvml import GpuReading
from dflashd.supervisor.watch.progress import Change
from dflashd.supervisor.watch.run import Run
from dflashd.supervisor.watch.slowness import slow_causes

SAME_STEP_SLACK: Final = 0.02  # a relaunch diverging within 2 % (or 10 steps) of the last one


def _members(run: Run) -> set[int]:
    members = run.custody.members() if run.custody is not None else set()
    return members or ({run.pid} if run.pid is not None else set())


def _held(run: Run) -> set[int]:
    use = run.gpu_use
    return {i for i, mib in use.per_gpu_mib.items() if (mib or 0) > 0} if use else set()


def pace_effects(
    run: Run, change: Change, gpus: tuple[GpuReading, ...], now: float
) -> tuple[Effect, ...]:
    """The evidence kept up to date; a slow incident opened (record, alert, a stacks dump for a
    straggler) or closed (record, ``recovered``)."""
    pace, evidence = run.progress.pace, run.pace_evidence
    if run.progress.reached_first_step and evidence.cpu_due(now):
        evidence.read_cpu(_members(run), now)
    learnt: tuple[Effect, ...] = ()
    if pace.baseline_s is not None and not evidence.learnt:
        evidence.baseline_learnt(gpus, _held(run), now)
        base = {"baseline_step_s": round(pace.baseline_s, 6), "step": run.progress.step}
        learnt = (WriteRecord(Event.PACE, base),)
    if change.pace.opened and pace.baseline_s is not None and pace.slow_since is not None:
        belongs = lambda pid: run.belongs(pid) or pid in run.pids_seen  # noqa: E731
        causes = slow_causes(
            evidence,
            pids=_members(run),
            belongs=belongs,
            gpus=gpus,
            held=_held(run),
            since=pace.slow_since,
            ratio=pace.ratio,
        )
        ratio = pace.ratio or 0.0
        fields: dict[str, Any] = {
            "ratio": round(ratio, 3),
            "baseline_step_s": round(pace.baseline_s, 6),
            "recent_step_s": round(pace.baseline_s * ratio, 6),
            "step": run.progress.step,
            "causes": causes,
        }
        run.slow = {**fields, "since_mono": pace.slow_since}
        why = f"{ratio:.2f}x its own step time ({'; '.join(causes)})"
        return (
            *learnt,
            WriteRecord(Event.SLOW, fields, log_level="warning"),
            SendAlert(Notice.SLOW, why, fields),
            DumpStacks("slow", ""),  # with several ranks, its odd rank out is the straggler
        )
    if change.pace.closed and run.slow is not None:
        lost = round(pace.lost_s, 3)
        fields = {
            "worst_ratio": round(pace.worst_ratio, 3),
            "lost_s": lost,
            "step": run.progress.step,
        }
        run.slow = None
        back = f"back to its own pace (it was up to {pace.worst_ratio:.2f}x slower)"
        return (
            *learnt,
            WriteRecord(Event.SLOW_OVER, fields),
            SendAlert(Notice.RECOVERED, back, fields),
        )
    return learnt


STRAGGLER_DUMPS: Final = 3  # one dump can catch every rank in its collective at once


def straggler_effects(run: Run, fields: dict[str, Any]) -> tuple[Effect, ...]:
    """The stacks taken at a slowdown: with several ranks, the odd rank out is the straggler;
    none found among several ranks, another dump, up to :data:`STRAGGLER_DUMPS`."""
    odd = fields.get("odd_rank_out")
    if run.slow is None:
        return ()
    ranks = [p for p in fields.get("processes") or () if p.get("rank") is not None]
    if not odd:
        tries = int(run.slow.get("dumps", 1))
        if len(ranks) >= 2 and tries < STRAGGLER_DUMPS:
            run.slow["dumps"] = tries + 1
            return (DumpStacks("slow", ""),)
        return ()
    said = {"straggler_ranks": odd, "where": fields.get("odd_summary")}
    run.slow["straggler"] = said
    return (WriteRecord(Event.SLOW_CAUSE, said, log_level="warning"),)


def loss_effects(run: Run, *, on_diverge: str, diverged_before: int | None) -> tuple[Effect, ...]:
    """The loss diverged: said once; with ``on_diverge = "stop"`` (or a relaunch diverging at
    the same step again) the run is ended, no restart, and the end's alert says it."""
    watch = run.progress.losses
    began = watch.diverged_at
    fields: dict[str, Any] = {
        "step": began,
        "last_good_step": watch.last_good_step,
        "why": watch.why,
    }
    again = (
        diverged_before is not None
        and began is not None
        and abs(began - diverged_before) <= max(10, SAME_STEP_SLACK * abs(diverged_before))
    )
    stop = on_diverge == "stop" or again
    fields["then"] = "stop" if stop else "alert"
    if again:
        fields["again_at_step"] = diverged_before
    run.diverged = fields
    said = WriteRecord(Event.DIVERGED, fields, log_level="warning")
    if stop:
        run.end_wanted = EndedBy.DIVERGED  # the end's own alert (fatal) says the last good step
        return (said,)
    why = f"the loss diverged at step {began} (last good step {watch.last_good_step}): {watch.why}"
    return (said, SendAlert(Verdict.DIVERGED, why, fields))
