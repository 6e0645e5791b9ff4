"""What a new daemon carries over from the last one (its state.json, runs.sqlite and log).

What a dead daemon left is ended and proven ours first (the host's part); what was read and
done goes to the model as one :class:`~dflashd.supervisor.model.inputs.CarriedOver`, whose
:func:`~dflashd.supervisor.model.carried.restore` (pure) says what carries over.
"""

from __future__ import annotations

from typing import Any

from dflashd.supervisor.host.clock import Clock
from dflashd.supervisor.host.home import Home
from dflashd.supervisor.host.processops import ProcessOps
from dflashd.supervisor.host.recovery import lost_run
from dflashd.supervisor.host.runlog import unsaved_progress
from dflashd.supervisor.model.inputs import CarriedOver
from dflashd.supervisor.speak.reporter import Reporter


def carried_over(
    previous: dict[str, Any],
    *,
    reporter: Reporter,
    ops: ProcessOps,
    clock: Clock,
    home: Home,
    boot_id: str | None,
    stop_s: float,
) -> CarriedOver:
    """What start-up carries over, once what a dead daemon left is ended, proven ours."""
    history, writer = reporter.history, reporter.writer
    saved = history.goodput() if history is not None else None
    leftovers = ops.recover(previous, boot_id, stop_s)
    logged = unsaved_progress(saved, previous, home.logs)
    now_wall = clock.time()
    return CarriedOver(
        previous,
        saved_goodput=saved,
        leftovers=tuple(leftovers),
        torn_bytes=writer.torn_bytes,
        last_run=writer.last_run,
        now_wall=now_wall,
        logged=logged,
        lost=lost_run(previous, now_wall),
    )
