"""The one deadline table: every time at which the daemon has something to do.

The loop sleeps until the earliest of them (:meth:`Deadlines.next_timeout`), or until an
event when none is set: an idle daemon makes no periodic wake-ups.  Two more times are
computed where their facts live and passed in: the live run's stall deadline (from its
progress) and a printed step waiting to be counted (the line watcher's debounce).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum
from typing import Any, Final

STATE_WRITE_MIN_S: Final = 1.0  # state.json at most once a second while things change


class Deadline(Enum):
    """The deadlines of the table (each a field of :class:`Deadlines`)."""

    RESTART = "restart_at"  # the next launch (after the backoff, or a deferral)
    RELEASE_CHECK = "release_check_at"  # look again whether the dead run is gone and released
    STOP = "stop_at"  # the stop's grace is over
    WATCHDOG = "watchdog_at"  # systemd's WATCHDOG=1
    KILL = "kill_at"  # the live run's SIGKILL, once its dump is in (or past its bound)
    HANG = "hang_at"  # the live run's next hang (or start-up) sample or judgement


RUN_DEADLINES: Final = (Deadline.KILL, Deadline.HANG)  # cleared when the run dies


@dataclass(frozen=True, slots=True)
class Deadlines:
    """Monotonic times (None: not set), and the status write's throttle."""

    restart_at: float | None = None
    release_check_at: float | None = None
    stop_at: float | None = None
    watchdog_at: float | None = None
    kill_at: float | None = None
    hang_at: float | None = None
    state_dirty: bool = False
    last_state_write: float = float("-inf")

    def at(self, deadline: Deadline) -> float | None:
        """When ``deadline`` is due (None: not set)."""
        value: float | None = getattr(self, deadline.value)
        return value

    def set(self, deadline: Deadline, at: float | None) -> Deadlines:
        """The table with ``deadline`` at ``at`` (None: cleared)."""
        changes: dict[str, Any] = {deadline.value: at}
        return replace(self, **changes)

    def is_due(self, deadline: Deadline, now: float) -> bool:
        """``deadline`` is set and has come."""
        at = self.at(deadline)
        return at is not None and now >= at

    def changed(self) -> Deadlines:
        """Something status shows changed: a write within the throttle."""
        return self if self.state_dirty else replace(self, state_dirty=True)

    def published(self, now: float) -> Deadlines:
        """The status was just written."""
        return replace(self, state_dirty=False, last_state_write=now)

    def state_write_due(self, now: float) -> bool:
        """A change is waiting and the throttle allows a write."""
        return self.state_dirty and now >= self.last_state_write + STATE_WRITE_MIN_S

    def next_timeout(self, now: float, *computed: float | None) -> float | None:
        """How long the loop may sleep (None: until an event): the earliest of the table, the
        status write's throttle and the ``computed`` times."""
        write = self.last_state_write + STATE_WRITE_MIN_S if self.state_dirty else None
        due = [at for at in (*(self.at(d) for d in Deadline), write, *computed) if at is not None]
        return max(0.0, min(due) - now) if due else None
