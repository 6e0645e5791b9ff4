"""JSON of anything, never raising: the one encoder for what dflashd writes from outside input.

A record, state.json, a control reply or an alert may carry a number the job printed or a
hand-edited state.json held; orjson refuses an integer beyond 64 bits, a non-string key,
deep nesting or a cycle by raising, and a raise in the writer thread or the loop would
cost the log or the daemon.  :func:`dumps_any` never raises.  A leaf: orjson only.
"""

from __future__ import annotations

from typing import Any, Final

import orjson

_MAX_DEPTH: Final = 64
_INT_RANGE: Final = (-(2**63), 2**64 - 1)  # what orjson encodes as a number


def dumps_any(obj: Any, option: int = 0) -> bytes:
    """JSON of anything, never raising: what orjson refuses (an integer beyond 64 bits, a
    non-string key, nesting past its limit, a cycle) is made encodable by :func:`json_safe`
    (the odd value kept as text) and encoded again."""
    try:
        return orjson.dumps(obj, option=option, default=str)
    except (orjson.JSONEncodeError, TypeError, ValueError, RecursionError):
        return orjson.dumps(json_safe(obj), option=option, default=str)


def json_safe(obj: Any, depth: int = 0) -> Any:
    """A copy of ``obj`` that orjson encodes: out-of-range integers and whatever is too deep
    become their text (cut at 200 characters), keys become strings."""
    if isinstance(obj, bool) or obj is None or isinstance(obj, str | float):
        return obj
    if isinstance(obj, int):
        return obj if _INT_RANGE[0] <= obj <= _INT_RANGE[1] else _text(obj)
    if depth >= _MAX_DEPTH:
        return _text(obj)
    if isinstance(obj, dict):
        return {_key(k): json_safe(v, depth + 1) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_safe(v, depth + 1) for v in obj]
    return _text(obj)


def _key(key: Any) -> str:
    return key if isinstance(key, str) else _text(key)


def _text(value: Any) -> str:
    try:
        text = value.__str__() if not isinstance(value, int) else _int_text(value)
    except Exception:  # a value whose str() raises: still no crash
        text = f"<{type(value).__name__}>"
    return text[:200]


def _int_text(value: int) -> str:
    try:
        return str(value)
    except ValueError:  # more digits than int->str allows
        return f"<integer of {value.bit_length()} bits>"
