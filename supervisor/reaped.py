"""What the host says of a reaped run: its wait status, its CPU time, its output's last lines.

The death walk reads reap -> conclude -> apply.  This is the reap side: :func:`mark_reaped`
says the run is over (its phase, its custody no longer trusting the pid) and measures its
CPU; :func:`reaped` reads what else the host says of its end into a
:class:`~dflashd.supervisor.model.inputs.Reaped`, from which the model builds the facts
(model/died.py) that :func:`~dflashd.supervisor.model.ending.conclude` decides from.
"""

from __future__ import annotations

import os

from dflashd.supervisor.host.caches import stale_build_locks
from dflashd.supervisor.host.processops import ProcessOps
from dflashd.supervisor.model.inputs import Reaped
from dflashd.supervisor.model.runstate import RunFacts, RunState
from dflashd.supervisor.model.verdicts import Observations
from dflashd.supervisor.watch.run import Run


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


def reaped(
    run: Run, status: int | None, cpu_s: float | None, *, died_mono: float, ended_at: float
) -> Reaped:
    """What the host says of a reaped run's end (``status`` None: unknown), for the model."""
    facts = run.facts
    exited = status is not None and os.WIFEXITED(status)
    signalled = status is not None and os.WIFSIGNALED(status)
    root = facts.extensions_root  # looked for only where the run died before its first step
    early = root is not None and not facts.progress.reached_first_step
    return Reaped(
        run.run_no,
        exit_code=os.WEXITSTATUS(status) if exited and status is not None else None,
        signal=os.WTERMSIG(status) if signalled and status is not None else None,
        died_mono=died_mono,
        ended_at=ended_at,
        cpu_s=cpu_s,
        tails={d.src: tuple(d.tail) for d in run.drains},
        output_lines=sum(d.line_count for d in run.drains),
        status_unknown=status is None,
        oom_kills=run.custody.oom_kills() if run.custody is not None else 0,
        flight_recorder=flight_traces(facts),
        stale_build_locks=stale_build_locks(root, facts.started_wall) if early and root else (),
    )


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
