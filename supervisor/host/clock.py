"""Time, injected: the daemon, the policy and progress read the clock through this seam.

Production uses :class:`SystemClock`; the loop tests use :class:`ManualClock` and move time
by hand, so a stall after 900 s or a backoff of 300 s is tested in milliseconds.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """Monotonic time for deadlines, wall time for records and status."""

    def monotonic(self) -> float:
        """Seconds on a clock that never jumps (deadlines, durations)."""
        ...

    def time(self) -> float:
        """Seconds since the epoch (what a person reads)."""
        ...


class SystemClock:
    """The real clocks."""

    def monotonic(self) -> float:
        """``time.monotonic()``."""
        return time.monotonic()

    def time(self) -> float:
        """``time.time()``."""
        return time.time()


class ManualClock:
    """A clock that moves only when told to (tests)."""

    def __init__(self, start_mono: float = 1000.0, start_wall: float = 1.7e9) -> None:
        self._mono = start_mono
        self._offset = start_wall - start_mono

    def monotonic(self) -> float:
        """The current fake monotonic time."""
        return self._mono

    def time(self) -> float:
        """Wall time moves with the monotonic time."""
        return self._mono + self._offset

    def advance(self, seconds: float) -> None:
        """Move time forward."""
        self._mono += seconds
