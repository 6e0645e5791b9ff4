"""Types of the names ``dflashd.logs`` imports on first use (``__init__.py``)."""

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
