"""What a reaped run leaves to conclude from: its wait status, its evidence, its CPU time.

The death walk reads reap -> conclude -> apply.  This is the reap side: :func:`mark_reaped`
says the run is over (its phase, its custody no longer trusting the pid) and measures its
CPU; :func:`reaped_facts` turns the run and its wait status into the
:class:`~dflashd.supervisor.model.ending.RunFacts` that :func:`~dflashd.supervisor.model.ending.conclude`
decides from.
"""

from __future__ import annotations

import os
from typing import Final

from dflashd.supervisor.host.caches import stale_build_locks
from dflashd.supervisor.host.processops import ProcessOps
from dflashd.supervisor.model.advice import checkpoint_cost
from dflashd.supervisor.model.hang import HangWatch
from dflashd.supervisor.model.runstate import RunFacts, RunState
from dflashd.supervisor.model.verdicts import Observations
from dflashd.supervisor.watch.run import Run

ELSEWHERE_RECENT_S: Final = 60.0  # a wait elsewhere seen this recently explains a death


def mark_reaped(run: Run, status: int | None, ops: ProcessOps) -> float | None:
    """The child was reaped (``status`` None: gone, status unknown): the run is over.

    Returns the CPU-seconds the run used: the reaped child's and its waited-for
    descendants', or the whole run cgroup's (workers in sessions of their own included).
    """
    run.reaped = True
    if run.launched is not None and run.launched.process is not None:
        run.launched.process.returncode = (
            -1 if status is None else os.waitstatus_to_exitcode(status)
        )
    cpu_s = ops.reaped_cpu_s(run.pid) if run.pid is not None else None
    custody = run.custody
    if custody is not None and custody.mode == "cgroup":
        whole = custody.cpu_time_s()
        cpu_s = max(cpu_s or 0.0, whole) if whole is not None else cpu_s
    if custody is not None:
        custody.reaped(cpu_s)  # its pid proves nothing from now on
    return cpu_s


def observations(
    run: Run,
    status: int | None,
    stderr_tail: tuple[str, ...],
    duration_s: float = 0.0,
    cpu_s: float | None = None,
) -> Observations:
    """What the classifier may look at, from a reaped run and its wait status (None: unknown)."""
    facts = run.facts
    return Observations(
        exit_code=os.WEXITSTATUS(status) if status is not None and os.WIFEXITED(status) else None,
        signal=os.WTERMSIG(status) if status is not None and os.WIFSIGNALED(status) else None,
        ended_by=facts.ended_by,
        reached_first_step=facts.progress.reached_first_step,
        output_lines=sum(d.line_count for d in run.drains),
        stderr_tail=stderr_tail,
        gpu_xids=facts.gpu_xids,
        status_unknown=status is None,
        oom_kills=run.custody.oom_kills() if run.custody is not None else 0,
        lived_s=facts.lived_s(duration_s, cpu_s),
        cpu_s=cpu_s or 0.0,
        diverged=_diverged(facts),
    )


def _diverged(run: RunState) -> tuple[int | None, int | None] | None:
    """Where the run's loss diverged and its last good step (None: it did not)."""
    watch = run.progress.losses
    return (watch.diverged_at, watch.last_good_step) if watch.diverged else None


def reaped_facts(
    handles: Run,
    status: int | None,
    *,
    died_mono: float,
    ended_at: float,
    cpu_s: float | None,
    watch: HangWatch,
) -> RunFacts:
    """Everything :func:`~dflashd.supervisor.model.ending.conclude` needs about a reaped run
    (``watch``: its hang evidence, which the model keeps)."""
    tails = {d.src: tuple(d.tail) for d in handles.drains}
    run = handles.facts
    duration = died_mono - run.started_mono
    obs = observations(handles, status, tails.get("stderr", ()), duration, cpu_s)
    first = run.progress.first_step_mono
    last = run.progress.last_progress_mono or first
    return RunFacts(
        run.run_no,
        obs,
        duration,
        ended_at=ended_at,
        first_step_after_s=None if first is None else first - run.started_mono,
        # no step seen: the time it was alive stands for progress (a long run resets budgets)
        progress_s=obs.lived_s if first is None or last is None else last - first,
        step=run.progress.step,
        epoch=run.progress.epoch,
        tail=tails.get("stderr") or tails.get("stdout") or (),
        already_alerted=run.alerted,
        stacks=dict(run.stacks) if run.stacks is not None else None,
        flight_recorder=flight_traces(run),
        hung_after_s=run.hung_after_s,
        stale_build_locks=(
            stale_build_locks(run.extensions_root, run.started_wall)
            if run.extensions_root is not None and first is None
            else ()
        ),
        times=run.times(),
        died_mono=died_mono,
        hang_evidence=watch.last_finding if run.hung_after_s is not None else None,
        waited_elsewhere=waited_elsewhere(run, watch, died_mono),
        pause_s=checkpoint_cost(run.progress.pace.pauses),
    )


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


def flight_traces(run: RunState) -> tuple[str, ...]:
    """The NCCL flight-recorder traces this run's ranks left (``TORCH_FR_DUMP_TEMP_FILE``)."""
    prefix = run.flight_prefix
    if prefix is None:
        return ()
    try:
        return tuple(str(p) for p in sorted(prefix.parent.glob(prefix.name + "*")) if p.is_file())
    except OSError:
        return ()


def spawn_failed_facts(run: RunState, error: str, *, ended_at: float) -> RunFacts:
    """A launch whose exec failed: nothing ran."""
    return RunFacts(
        run.run_no,
        Observations(spawn_error=error),
        0.0,
        ended_at=ended_at,
        already_alerted=run.alerted,
        times=run.times(),
        died_mono=run.started_mono,
    )
