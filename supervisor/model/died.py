"""What is known of a run once its root was reaped: the run's facts as the model kept them, its
hang evidence, and what the host said of its end (:class:`~dflashd.supervisor.model.inputs.Reaped`),
made into the :class:`~dflashd.supervisor.model.runstate.RunFacts` that
:func:`~dflashd.supervisor.model.ending.conclude` judges.  How long the run lived (early death
against crash), where its loss diverged, whether it died waiting on work elsewhere: decided
here, from the model's own state.  No clock, no I/O.
"""

from __future__ import annotations

from typing import Final

from dflashd.supervisor.model.advice import checkpoint_cost
from dflashd.supervisor.model.hang import HangWatch
from dflashd.supervisor.model.inputs import Reaped
from dflashd.supervisor.model.runstate import RunFacts, RunState
from dflashd.supervisor.model.verdicts import Observations

ELSEWHERE_RECENT_S: Final = 60.0  # a wait elsewhere seen this recently explains a death


def died_facts(run: RunState, watch: HangWatch, reaped: Reaped) -> RunFacts:
    """Everything ``conclude`` needs about a reaped run (``watch``: its hang evidence)."""
    duration = reaped.died_mono - run.started_mono
    progress = run.progress
    stderr = reaped.tails.get("stderr", ())
    obs = Observations(
        exit_code=reaped.exit_code,
        signal=reaped.signal,
        ended_by=run.ended_by,
        reached_first_step=progress.reached_first_step,
        output_lines=reaped.output_lines,
        stderr_tail=stderr,
        gpu_xids=run.gpu_xids,
        status_unknown=reaped.status_unknown,
        oom_kills=reaped.oom_kills,
        lived_s=run.lived_s(duration, reaped.cpu_s),
        cpu_s=reaped.cpu_s or 0.0,
        diverged=_diverged(run),
    )
    first = progress.first_step_mono
    last = progress.last_progress_mono or first
    return RunFacts(
        run.run_no,
        obs,
        duration,
        ended_at=reaped.ended_at,
        first_step_after_s=None if first is None else first - run.started_mono,
        # no step seen: the time it was alive stands for progress (a long run resets budgets)
        progress_s=obs.lived_s if first is None or last is None else last - first,
        step=progress.step,
        epoch=progress.epoch,
        tail=stderr or reaped.tails.get("stdout") or (),
        already_alerted=run.alerted,
        stacks=dict(run.stacks) if run.stacks is not None else None,
        flight_recorder=reaped.flight_recorder,
        hung_after_s=run.hung_after_s,
        stale_build_locks=reaped.stale_build_locks if first is None else (),
        times=run.times(),
        died_mono=reaped.died_mono,
        hang_evidence=watch.last_finding if run.hung_after_s is not None else None,
        waited_elsewhere=waited_elsewhere(run, watch, reaped.died_mono),
        pause_s=checkpoint_cost(progress.pace.pauses),
    )


def _diverged(run: RunState) -> tuple[int | None, int | None] | None:
    """Where the run's loss diverged and its last good step (None: it did not)."""
    watch = run.progress.losses
    return (watch.diverged_at, watch.last_good_step) if watch.diverged else None


def waited_elsewhere(run: RunState, watch: HangWatch, died_mono: float) -> tuple[str, float] | None:
    """A run that died (not ended by dflashd) within a round or two of waiting on work
    elsewhere: that wait and how long it lasted (its peer was likely lost)."""
    last = watch.elsewhere_last
    if last is None or run.ended_by_us or died_mono - last[2] > ELSEWHERE_RECENT_S:
        return None
    why, since, seen = last
    # the wait began no later than the last step: the round that named it came 12 s or more
    # into the silence ("after waiting 1s" said so of a rank 25 s in its barrier)
    stepped = run.progress.last_progress_mono
    if stepped is not None and stepped < since:
        since = stepped
    return why, max(seen, died_mono) - since
