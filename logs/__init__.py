"""dflashd.logs: structured JSON-lines records, a line framer, a rotating writer and readers.

A training run's log always exists and loses nothing: the framer turns any byte stream
into whole records, the writer rotates by rename with a bounded total and a ``seq`` that
survives crashes, and the readers read across rotations (``tail -F`` included).
"""

from dflashd.logs.framer import DEFAULT_MAX_LINE_BYTES, Frame, LineFramer
from dflashd.logs.logset import log_files
from dflashd.logs.reader import RecordFilter, follow, last_records, read_records
from dflashd.logs.records import (
    EventRecord,
    LineRecord,
    Record,
    RecordError,
    decode,
    encode,
    reassemble,
    utc_timestamp,
)
from dflashd.logs.sink import LogSink, SinkStats
from dflashd.logs.writer import LogWriterError, RotatingLogWriter, WriterStats

__all__ = [
    "DEFAULT_MAX_LINE_BYTES",
    "EventRecord",
    "Frame",
    "LineFramer",
    "LineRecord",
    "LogSink",
    "LogWriterError",
    "Record",
    "RecordError",
    "RecordFilter",
    "RotatingLogWriter",
    "SinkStats",
    "WriterStats",
    "decode",
    "encode",
    "follow",
    "last_records",
    "log_files",
    "read_records",
    "reassemble",
    "utc_timestamp",
]
