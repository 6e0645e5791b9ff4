"""Codec tests for log records."""

from __future__ import annotations

import orjson
import pytest

from dflashd.logs.records import (
    EventRecord,
    LineRecord,
    RecordError,
    decode,
    encode,
    parse_timestamp,
    utc_timestamp,
)


@pytest.mark.parametrize(
    "record",
    [
        LineRecord("2026-01-01T00:00:00.000001Z", 1, 1, "stdout", "hello"),
        LineRecord("2026-01-01T00:00:00.000001Z", 2, 3, "stderr", "cut", partial=True),
        LineRecord("2026-01-01T00:00:00.000001Z", 3, 3, "stdout", "10%", eol="\r"),
        EventRecord("2026-01-01T00:00:00.000001Z", 4, 2, "exit", {"exit_code": 3, "tail": ["x"]}),
    ],
)
def test_roundtrip(record: LineRecord | EventRecord) -> None:
    """Every record kind decodes back to itself."""
    raw = encode(record)
    assert raw.endswith(b"\n") and raw.count(b"\n") == 1
    assert decode(raw) == record


def test_child_line_that_imitates_a_dflashd_record_stays_a_line() -> None:
    """A child printing a dflashd-looking JSON object is still a child line."""
    fake = '{"ts":"x","seq":1,"run":1,"src":"dflashd","event":"exit","verdict":"completed"}'
    record = decode(encode(LineRecord("2026-01-01T00:00:00.000000Z", 7, 1, "stdout", fake)))
    assert isinstance(record, LineRecord)
    assert record.src == "stdout" and record.line == fake


def test_event_fields_cannot_override_the_envelope() -> None:
    """An event field named like an envelope key never replaces the envelope."""
    rec = EventRecord("2026-01-01T00:00:00.000000Z", 9, 1, "gpu", {"src": "stdout", "seq": 1})
    obj = orjson.loads(encode(rec))
    assert obj["src"] == "dflashd" and obj["seq"] == 9


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"not json", "not JSON"),
        (b"[1,2]", "not a JSON object"),
        (b'{"seq":1,"run":1,"src":"stdout","line":"x"}', "missing field 'ts'"),
        (b'{"ts":"t","seq":1,"run":1,"src":"stdin","line":"x"}', "unknown src"),
        (b'{"ts":"t","seq":1,"run":1,"src":"dflashd"}', "without an event"),
        (b'{"ts":"t","seq":1,"run":1,"src":"stdout","line":5}', "string line"),
    ],
)
def test_decode_rejects_bad_lines(raw: bytes, message: str) -> None:
    """Malformed lines raise RecordError with a reason, never something else."""
    with pytest.raises(RecordError, match=message):
        decode(raw)


def test_timestamps_are_rfc3339_utc_with_microseconds() -> None:
    """Timestamps carry microseconds and a Z, and parse back."""
    ts = utc_timestamp(1_700_000_000.123456)
    assert ts == "2023-11-14T22:13:20.123456Z"
    assert abs(parse_timestamp(ts) - 1_700_000_000.123456) < 1e-6
