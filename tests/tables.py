"""Values the table tests hand the model: no process, file, pipe or clock behind them."""

from __future__ import annotations

from collections.abc import Sequence

from dflashd.logs.records import EventRecord
from dflashd.supervisor.model.effects import Effect
from dflashd.supervisor.model.inputs import Input, Launched
from dflashd.supervisor.model.progress import Progress
from dflashd.supervisor.model.runstate import RunState
from dflashd.supervisor.model.step import DaemonState, step

WALL_AT_ZERO = 1_700_000_000.0  # the wall clock when the monotonic one reads 0


def run_state(at: float, run_no: int = 1, *, sees_steps: bool = False) -> RunState:
    """A run launched at ``at`` (monotonic), as the model knows it before any evidence."""
    progress = Progress(at, sees_steps)
    return RunState(run_no, ("python", "train.py"), at, WALL_AT_ZERO + at, progress)


def launch_heard(at: float, run_no: int = 1) -> Launched:
    """The launch of run ``run_no`` at ``at``, as the loop hears it."""
    return Launched(run_state(at, run_no))


def event_at(run: int, event: str, at: float, **fields: object) -> EventRecord:
    """A dflashd record of ``run`` written ``at`` seconds into 2026-12-04 (the report's input)."""
    stamp = f"2026-12-04T00:{int(at) // 60:02d}:{at % 60:06.3f}Z"
    return EventRecord(ts=stamp, seq=int(at * 1000), run=run, event=event, fields=dict(fields))


def play(
    state: DaemonState, history: Sequence[tuple[float, Input]]
) -> tuple[DaemonState, list[list[Effect]]]:
    """Each input at its time: the state at the end, and the effects of each step."""
    said: list[list[Effect]] = []
    for now, heard in history:
        state, effects = step(state, heard, now)
        said.append(list(effects))
    return state, said
