"""The loop's timers: every deadline the daemon keeps, in one place, as monotonic times.

The selector sleeps until the earliest of them (:meth:`Timers.next_timeout`), or forever
when none is set: an idle daemon makes no periodic wake-ups.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from dflashd.supervisor.run import Run
from dflashd.supervisor.watch.progress import Limits

STATE_WRITE_MIN_S: Final = 1.0  # state.json at most once a second while things change


@dataclass
class Timers:
    """Deadlines (None: not set) and the state-write throttle."""

    restart_at: float | None = None  # relaunch after the backoff
    release_check_at: float | None = None  # look again whether the dead run's GPU memory is free
    stop_deadline: float | None = None  # SIGKILL after the stop timeout
    watchdog_at: float | None = None  # systemd's WATCHDOG=1
    state_dirty: bool = False
    last_state_write: float = float("-inf")

    def deadlines(self, run: Run | None, limits: Limits, extra: float | None = None) -> list[float]:
        """Every time at which something is due, the live run's kill and stall deadlines included."""
        out = [self.restart_at, self.release_check_at, self.stop_deadline, self.watchdog_at, extra]
        if self.state_dirty:
            out.append(self.last_state_write + STATE_WRITE_MIN_S)
        if run is not None and run.alive:
            out.append(run.kill_at_mono)
            out.append(run.watcher.due() if run.watcher is not None else None)  # a pending step
            if not run.ended_by_us:
                out.append(run.progress.stall_deadline(limits))
                out.append(run.hang_due)
        return [d for d in out if d is not None]

    def next_timeout(
        self, run: Run | None, limits: Limits, now: float, extra: float | None = None
    ) -> float | None:
        """How long the selector may sleep (None: until an event); ``extra``: one more deadline."""
        due = self.deadlines(run, limits, extra)
        return max(0.0, min(due) - now) if due else None

    def state_write_due(self, now: float) -> bool:
        """A change is waiting and the throttle allows a write."""
        return self.state_dirty and now >= self.last_state_write + STATE_WRITE_MIN_S
