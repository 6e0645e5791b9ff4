"""Numbers that come from the job, bounded before anything keeps them.

A step, epoch or run number printed by a job, sent over notify or read back from
state.json is input from outside: one beyond JSON's safe integers (``2**53``), or a float
that is not finite, is refused here (the job's line itself stays in the log as text), so
no encoder, comparison or float conversion downstream ever meets it.  Stdlib only.
"""

from __future__ import annotations

import math
from typing import Final

MAX_COUNT: Final = 2**53  # JSON's safe integers: beyond, a "count" is not one


def bounded_int(value: object) -> int | None:
    """An integer (or its decimal text) whose size is below :data:`MAX_COUNT`; else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        text = value.strip()
        if not text or len(text) > 20:  # 2**53 has 16 digits: longer text is no count
            return None
        try:
            value = int(text)
        except ValueError:
            return None
    if isinstance(value, int) and abs(value) < MAX_COUNT:
        return value
    return None


def finite_float(value: object) -> float | None:
    """A finite float (from a float, an int or text); None for NaN, infinities and the rest."""
    if isinstance(value, bool):
        return None
    try:
        number = float(value) if isinstance(value, int | float | str) else None
    except (ValueError, OverflowError):
        return None
    return number if number is not None and math.isfinite(number) else None
