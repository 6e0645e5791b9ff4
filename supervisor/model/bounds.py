"""Numbers that come from the job, bounded before anything keeps them.

A step, epoch or run number printed by a job, sent over notify or read back from
state.json is input from outside: one beyond JSON's safe integers (``2**53``), or a float
that is not finite, is refused here (the job's line itself stays in the log as text), so
no encoder, comparison or float conversion downstream ever meets it.  Stdlib only.

The config's bounded fields (:func:`bounded_field`, :func:`seconds_field`) live here too: a
bound sits next to its field, in the field's metadata, and the config's parser checks it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import field
from typing import Any, Final

MAX_COUNT: Final = 2**53  # JSON's safe integers: beyond, a "count" is not one
# Deadlines must stay finite and representable for select() and float arithmetic: no
# duration may exceed about 115 days (longer than any run this tool supervises).
MAX_SECONDS: Final = 1e7


def bounded_field(
    default: Any = None,
    *,
    factory: Callable[[], Any] | None = None,
    low: float | None = None,
    above: float | None = None,
    high: float | None = None,
) -> Any:
    """A config field with its bound: ``low`` <= value, ``above`` < value, value <= ``high``."""
    meta = {"low": low, "above": above, "high": high}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def seconds_field(default: float, *, above: float | None = 0.0, low: float | None = None) -> Any:
    """A duration field: finite, at most :data:`MAX_SECONDS`."""
    return bounded_field(default, above=above, low=low, high=MAX_SECONDS)


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
