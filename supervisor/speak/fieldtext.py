"""Values as a person reads them (pure, a leaf): a record's field in ``tail``'s text view
and the foreground's ``r1 dflashd | …`` lines, and status' line for one recovery
(model/recoveries.py's view)."""

from __future__ import annotations

import math
from typing import Any

import orjson


def value_text(value: Any) -> str:
    """A field's value as a person reads it: ``12.5``, ``a,b,c``, ``{productive_s:12.5
    startup_s:4.1}``; never a Python repr, and cut at a separator, saying how many were left."""
    if isinstance(value, dict):
        items = [f"{k}:{scalar_text(v)}" for k, v in value.items()]
        text, sep, close = "{", " ", "}"
    elif isinstance(value, list | tuple):
        items = [scalar_text(v) for v in value]
        text, sep, close = "", ",", ""
    else:
        text = scalar_text(value)
        return text if len(text) <= 120 else text[:117] + "..."
    shown: list[str] = []
    for item in items:
        if len(text) + len(sep.join([*shown, item])) > 110 and shown:
            return text + sep.join(shown) + f"{sep}…(+{len(items) - len(shown)}){close}"
        shown.append(item)
    return text + sep.join(shown) + close


def scalar_text(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list | tuple):
        return orjson.dumps(value, default=str).decode()
    return str(value)


def nonneg(value: Any) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    return max(0.0, float(value)) if ok else 0.0


def recovery_line(view: dict[str, Any]) -> str:
    """``recovery of run 4 (after hung): detection 6.0s, teardown 0.4s, warm start 0.6s,
    redone 12 steps 3.1s = 10.1s``: status' line."""

    def sec(value: Any) -> str:
        number = nonneg(value)
        return f"{number:.1f}s" if number < 100 else f"{number:.0f}s"

    parts = [f"detection {sec(view.get('detection_s'))}", f"teardown {sec(view.get('teardown_s'))}"]
    start = str(view.get("start") or "cold")
    started = view.get("start_s")
    parts.append(f"{start} start " + ("…" if started is None else sec(started)))
    steps = view.get("redone_steps")
    if isinstance(steps, int):
        parts.append(f"redone {steps} step{'s' if steps != 1 else ''} {sec(view.get('redone_s'))}")
    done = "" if view.get("back") else " so far"
    head = f"recovery of run {view.get('run')} (after {view.get('after')})"
    return f"{head}: {', '.join(parts)} = {sec(view.get('total_s'))}{done}"
