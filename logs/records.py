"""The log record schema (docs/design.md, "Records") and its JSON-lines codec.

Every record carries ``ts`` (RFC 3339 UTC, microseconds), ``seq`` (+1 per record,
never reused), ``run`` (launch number) and ``src`` (``stdout``, ``stderr`` or
``dflashd``).  Child output is always a string in ``line``; a supervisor record
has ``event`` plus free fields.  Because the ``src`` of a child line is set by
the supervisor from the pipe it came from, no byte a child writes can become a
``dflashd`` record: at worst it is a ``line`` that looks like JSON.
"""

from __future__ import annotations

import datetime as _dt
import math
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import orjson

from dflashd.logs.framer import Frame
from dflashd.logs.linecodec import CODEC, FrameRecords, encode_parts
from dflashd.logs.safejson import dumps_any

Source = Literal["stdout", "stderr", "dflashd"]
SOURCES: Final[tuple[str, ...]] = ("stdout", "stderr", "dflashd")
CHILD_SOURCES: Final[tuple[str, ...]] = ("stdout", "stderr")

# Keys that belong to the envelope of a supervisor record; an event's fields may not use them.
ENVELOPE_KEYS: Final[frozenset[str]] = frozenset({"ts", "seq", "run", "src", "event", "line"})
RECORD_END: Final = b'"}\n'  # closes a line record's string and object


class RecordError(ValueError):
    """A line that is not a valid dflashd record."""


# The last second formatted, and its text: a flood writes hundreds of frames a second, each
# with its timestamp; formatting the date once a second took ~9 % of the writer thread.
_SECOND: list[tuple[int, str]] = [(-(2**62), "")]


def utc_timestamp(epoch_s: float) -> str:
    """Format a wall-clock time as RFC 3339 UTC with microseconds (``...T12:00:00.000123Z``),
    rounded as ``datetime.fromtimestamp`` rounds (half to even)."""
    frac, whole = math.modf(epoch_s)
    second, micro = int(whole), round(frac * 1e6)
    if micro >= 1_000_000:
        second, micro = second + 1, micro - 1_000_000
    elif micro < 0:
        second, micro = second - 1, micro + 1_000_000
    cached_second, text = _SECOND[0]
    if second != cached_second:
        moment = _dt.datetime.fromtimestamp(second, tz=_dt.UTC)
        text = moment.strftime("%Y-%m-%dT%H:%M:%S")
        _SECOND[0] = (second, text)  # one item replaced whole: a racing thread sees either
    return f"{text}.{micro:06d}Z"


def parse_timestamp(ts: str) -> float:
    """Inverse of :func:`utc_timestamp`: epoch seconds."""
    return _dt.datetime.strptime(ts, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=_dt.UTC).timestamp()


@dataclass(frozen=True, slots=True)
class LineRecord:
    """One line (or a cut piece of one) that the child wrote to stdout or stderr."""

    ts: str
    seq: int
    run: int
    src: Literal["stdout", "stderr"]
    line: str
    partial: bool = False
    # The terminator when it was not "\n": "\r\n" or "\r" (a progress-bar redraw).
    eol: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of this record, optional fields only when set."""
        out: dict[str, Any] = {
            "ts": self.ts,
            "seq": self.seq,
            "run": self.run,
            "src": self.src,
            "line": self.line,
        }
        if self.partial:
            out["partial"] = True
        if self.eol is not None:
            out["eol"] = self.eol
        return out


@dataclass(frozen=True, slots=True)
class EventRecord:
    """A record written by the supervisor itself (``src`` is always ``dflashd``)."""

    ts: str
    seq: int
    run: int
    event: str
    fields: dict[str, Any] = field(default_factory=dict)

    @property
    def src(self) -> Literal["dflashd"]:
        """Always ``dflashd``."""
        return "dflashd"

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of this record: envelope first, then the event's fields."""
        out: dict[str, Any] = {
            "ts": self.ts,
            "seq": self.seq,
            "run": self.run,
            "src": "dflashd",
            "event": self.event,
        }
        for key, value in self.fields.items():
            if key not in ENVELOPE_KEYS:
                out[key] = value
        return out


Record = LineRecord | EventRecord


def encode(record: Record) -> bytes:
    """One record as one JSON line, newline included."""
    return orjson.dumps(record.to_dict(), option=orjson.OPT_APPEND_NEWLINE)


def decode(raw: bytes | str) -> Record:
    """Parse one JSON line back into a record; raise :class:`RecordError` when it is not one."""
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise RecordError(f"not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise RecordError("not a JSON object")
    try:
        ts, seq, run, src = obj["ts"], obj["seq"], obj["run"], obj["src"]
    except KeyError as exc:
        raise RecordError(f"missing field {exc.args[0]!r}") from None
    if not isinstance(ts, str) or not isinstance(seq, int) or not isinstance(run, int):
        raise RecordError("bad envelope types")
    if src == "dflashd":
        event = obj.get("event")
        if not isinstance(event, str):
            raise RecordError("dflashd record without an event")
        fields = {k: v for k, v in obj.items() if k not in ENVELOPE_KEYS}
        return EventRecord(ts=ts, seq=seq, run=run, event=event, fields=fields)
    if src in CHILD_SOURCES:
        line = obj.get("line")
        if not isinstance(line, str):
            raise RecordError("child record without a string line")
        eol = obj.get("eol")
        return LineRecord(
            ts=ts,
            seq=seq,
            run=run,
            src=src,
            line=line,
            partial=bool(obj.get("partial", False)),
            eol=eol if isinstance(eol, str) else None,
        )
    raise RecordError(f"unknown src {src!r}")


def reassemble(records: list[LineRecord]) -> str:
    """The child's text back from its line records: each line plus its terminator.

    A ``partial`` record has no terminator of its own (it was cut, or the stream ended),
    so for valid UTF-8 input this gives back exactly what the child wrote.
    """
    parts: list[str] = []
    for rec in records:
        parts.append(rec.line)
        if not rec.partial:
            parts.append(rec.eol if rec.eol is not None else "\n")
    return "".join(parts)


def record_pieces(run: int, src: str, ts: str) -> tuple[bytes, bytes]:
    """A line record's bytes before its seq and between its seq and its line: ``head`` and
    ``mid`` of ``CODEC.encode`` (``RECORD_END`` closes it)."""
    return b'{"ts":"' + ts.encode() + b'","seq":', b',"run":%d,"src":"%s","line":"' % (
        run,
        src.encode(),
    )


@dataclass(frozen=True, slots=True)
class ScannedBatch:
    """A batch of scanned frames as ``CODEC.append_records`` takes them (one call encodes and
    writes all their records): ``bound`` is the most bytes they encode to."""

    frames: tuple[FrameRecords, ...]
    bound: int
    next_seq: int
    last_run: int


def scanned_batch(
    batch: list[tuple[int, str, Frame, float]], seq0: int, room: int
) -> ScannedBatch | None:
    """The frames of ``batch`` (run, src, frame, wall time), numbered from ``seq0``, as
    ``CODEC.append_records`` takes them, when it was built, each frame is scanned (its text
    JSON-safe, as the drain's C read leaves a flood's frames) and their records fit in ``room``
    bytes (no rotation inside); else None."""
    if CODEC.append_records is None:
        return None
    frames: list[FrameRecords] = []
    seq, bound, run = seq0, 0, 0
    for run_no, src, frame, wall_s in batch:
        count = len(frame)
        if not count:
            continue
        if frame.text is None or frame.flags is not None or frame.parts is not None:
            return None
        head, mid = record_pieces(run_no, src, utc_timestamp(wall_s))
        frames.append((frame.text, count, head, seq, mid))
        seq, run = seq + count, run_no
        bound += len(frame.text) + count * (len(head) + len(mid) + len(RECORD_END) + 20)
    return ScannedBatch(tuple(frames), bound, seq, run) if frames and bound <= room else None


def encode_frame(run: int, src: str, frame: Frame, ts: str, seq0: int) -> bytes:
    """The records of one frame's lines, numbered from ``seq0``, as JSON lines."""
    count = len(frame)
    if frame.flags is None and count:
        head, mid = record_pieces(run, src, ts)
        if frame.parts is not None:  # the Python scan split it already
            return encode_parts(frame.parts, head, seq0, mid, RECORD_END)
        if frame.text is not None:  # already valid JSON string content: one pass, in C where built
            return CODEC.encode(frame.text, count, head, seq0, mid, RECORD_END)
        # One orjson call for the whole frame.  Inside a JSON string every '"' is
        # escaped, so '","' only ever occurs between two array elements.
        escaped = orjson.dumps(frame.lines)[2:-2]
        if escaped.count(b'","') == count - 1:
            lines = escaped.replace(b'","', b"\n")  # an escaped line holds no raw newline
            return CODEC.encode(lines, count, head, seq0, mid, RECORD_END)
    flags = frame.flags if frame.flags is not None else [(False, None)] * count
    out = []
    for offset, (line, (partial, eol)) in enumerate(zip(frame.lines, flags, strict=True)):
        obj: dict[str, Any] = {
            "ts": ts,
            "seq": seq0 + offset,
            "run": run,
            "src": src,
            "line": line,
        }
        if partial:
            obj["partial"] = True
        if eol is not None:
            obj["eol"] = eol
        out.append(orjson.dumps(obj, option=orjson.OPT_APPEND_NEWLINE))
    return b"".join(out)


def encode_event(run: int, event: str, fields: dict[str, Any], ts: str, seq: int) -> bytes:
    """One ``dflashd`` record as a JSON line (envelope keys in ``fields`` are ignored)."""
    obj: dict[str, Any] = {"ts": ts, "seq": seq, "run": run, "src": "dflashd", "event": event}
    for key, value in fields.items():
        if key not in ENVELOPE_KEYS:
            obj[key] = value
    return dumps_any(obj, orjson.OPT_APPEND_NEWLINE | orjson.OPT_SERIALIZE_NUMPY)
