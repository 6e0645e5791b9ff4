"""What a run's pace and loss say, as effects: a slow incident opened or closed, a divergence
(issue 43).  The rules are pure (:mod:`~dflashd.supervisor.model.pace`,
:mod:`~dflashd.supervisor.model.divergence`); the causes are judged by :mod:`slowness`.
Slowness is never a reason to end a run; a divergence ends it only with ``on_diverge =
"stop"``, or when a relaunch diverges again at the step the last one did.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Final

from dflashd.supervisor.model.effects import DumpStacks, Effect, EndRun, SendAlert, WriteRecord
from dflashd.supervisor.model.events import Event
from dflashd.supervisor.model.progress import Change
from dflashd.supervisor.model.runstate import RunState
from dflashd.supervisor.model.verdicts import EndedBy, Notice, Verdict
from dflashd.supervisor.watch.nvml import GpuReading
from dflashd.supervisor.watch.run import Run
from dflashd.supervisor.watch.slowness import PaceEvidence, slow_causes

SAME_STEP_SLACK: Final = 0.02  # a relaunch diverging within 2 % (or 10 steps) of the last one


def _members(run: Run) -> set[int]:
    members = run.custody.members() if run.custody is not None else set()
    return members or ({run.pid} if run.pid is not None else set())


def _held(facts: RunState) -> set[int]:
    use = facts.gpu_use
    return {i for i, mib in use.per_gpu_mib.items() if (mib or 0) > 0} if use else set()


class PaceWatch:
    """The slowness evidence of the current run (its CPU waits over time, its GPUs when the
    baseline was learnt): read from the host, kept here, a fresh one for each run."""

    def __init__(self) -> None:
        self._of: tuple[int, PaceEvidence] | None = None

    def evidence(self, run_no: int) -> PaceEvidence:
        """Run ``run_no``'s evidence (a new run starts with none)."""
        if self._of is None or self._of[0] != run_no:
            self._of = (run_no, PaceEvidence())
        return self._of[1]

    def effects(
        self,
        run: Run,
        facts: RunState,
        change: Change,
        gpus: tuple[GpuReading, ...],
        now: float,
    ) -> tuple[RunState, tuple[Effect, ...]]:
        """The evidence kept up to date; a slow incident opened (record, alert, a stacks dump
        for a straggler) or closed (record, ``recovered``): the run's facts with it."""
        progress = facts.progress
        pace, evidence = progress.pace, self.evidence(facts.run_no)
        if progress.reached_first_step and evidence.cpu_due(now):
            evidence.read_cpu(_members(run), now)
        learnt: tuple[Effect, ...] = ()
        if pace.baseline_s is not None and not evidence.learnt:
            evidence.baseline_learnt(gpus, _held(facts), now)
            base = {"baseline_step_s": round(pace.baseline_s, 6), "step": progress.step}
            learnt = (WriteRecord(Event.PACE, base),)
        if change.pace.opened and pace.baseline_s is not None and pace.slow_since is not None:
            belongs = lambda pid: run.belongs(pid) or pid in facts.pids_seen  # noqa: E731
            causes = slow_causes(
                evidence,
                pids=_members(run),
                belongs=belongs,
                gpus=gpus,
                held=_held(facts),
                since=pace.slow_since,
                ratio=pace.ratio,
            )
            ratio = pace.ratio or 0.0
            fields: dict[str, Any] = {
                "ratio": round(ratio, 3),
                "baseline_step_s": round(pace.baseline_s, 6),
                "recent_step_s": round(pace.baseline_s * ratio, 6),
                "step": progress.step,
                "causes": causes,
                "slow_for_s": round(max(0.0, now - pace.slow_since), 1),  # when it began
            }
            facts = replace(facts, slow={**fields, "since_mono": pace.slow_since})
            why = f"{ratio:.2f}x its own step time ({'; '.join(causes)})"
            return facts, (
                *learnt,
                WriteRecord(Event.SLOW, fields, log_level="warning"),
                SendAlert(Notice.SLOW, why, fields),
                DumpStacks("slow", ""),  # with several ranks, its odd rank out is the straggler
            )
        if change.pace.closed and facts.slow is not None:
            lost = round(pace.lost_s, 3)
            fields = {
                "worst_ratio": round(pace.worst_ratio, 3),
                "lost_s": lost,
                "step": progress.step,
            }
            back = f"back to its own pace (it was up to {pace.worst_ratio:.2f}x slower)"
            return replace(facts, slow=None), (
                *learnt,
                WriteRecord(Event.SLOW_OVER, fields),
                SendAlert(Notice.RECOVERED, back, fields),
            )
        return facts, learnt


STRAGGLER_DUMPS: Final = 3  # one dump can catch every rank in its collective at once


def straggler(facts: RunState, fields: dict[str, Any]) -> tuple[RunState, tuple[Effect, ...]]:
    """The stacks taken at a slowdown: with several ranks, the odd rank out is the straggler;
    none found among several ranks, another dump, up to :data:`STRAGGLER_DUMPS`."""
    odd = fields.get("odd_rank_out")
    slow = facts.slow
    if slow is None:
        return facts, ()
    ranks = [p for p in fields.get("processes") or () if p.get("rank") is not None]
    if not odd:
        tries = int(slow.get("dumps", 1))
        if len(ranks) >= 2 and tries < STRAGGLER_DUMPS:
            return replace(facts, slow={**slow, "dumps": tries + 1}), (DumpStacks("slow", ""),)
        return facts, ()
    said = {"straggler_ranks": odd, "where": fields.get("odd_summary")}
    facts = replace(facts, slow={**slow, "straggler": said})
    return facts, (WriteRecord(Event.SLOW_CAUSE, said, log_level="warning"),)


def loss_effects(
    facts: RunState, *, on_diverge: str, before: int | None, tail: tuple[str, ...] = ()
) -> tuple[RunState, tuple[Effect, ...]]:
    """The loss diverged: said once; with ``on_diverge = "stop"`` (or a relaunch diverging at
    the same step again, ``before``) the run is ended, no restart, and the end's alert says it."""
    watch = facts.progress.losses
    began = watch.diverged_at
    fields: dict[str, Any] = {
        "step": began,
        "last_good_step": watch.last_good_step,
        "why": watch.why,
    }
    again = (
        before is not None
        and began is not None
        and abs(began - before) <= max(10, SAME_STEP_SLACK * abs(before))
    )
    stop = on_diverge == "stop" or again
    fields["then"] = "stop" if stop else "alert"
    if again:
        fields["again_at_step"] = before
    facts = replace(facts, diverged=fields)
    said = WriteRecord(Event.DIVERGED, fields, log_level="warning")
    if stop:  # the end's own alert (fatal) says the last good step
        return facts, (said, EndRun(EndedBy.DIVERGED))
    why = f"the loss diverged at step {began} (last good step {watch.last_good_step}): {watch.why}"
    # the alert carries the job's last lines: the divergence as the job printed it
    return facts, (said, SendAlert(Verdict.DIVERGED, why, {**fields, "tail": list(tail)}))
