"""dflashd.logs: structured JSON-lines records, a line framer, a rotating writer and readers.

A training run's log always exists and loses nothing: the framer turns any byte stream
into whole records, the writer rotates by rename with a bounded total and a ``seq`` that
survives crashes, and the readers read across rotations (``tail -F`` included).

The names below are imported on first use (``logs/__init__.pyi`` gives their types): a
command that needs one module of the package (``dflashd status`` needs ``safejson``) does not
pay for the writer, the sink and the readers at every start.
"""

import importlib
from typing import Any, Final

_WHERE: Final = {
    "DEFAULT_MAX_LINE_BYTES": "framer",
    "Frame": "framer",
    "LineFramer": "framer",
    "log_files": "logset",
    "RecordFilter": "reader",
    "follow": "reader",
    "last_records": "reader",
    "read_records": "reader",
    "EventRecord": "records",
    "LineRecord": "records",
    "Record": "records",
    "RecordError": "records",
    "decode": "records",
    "encode": "records",
    "reassemble": "records",
    "utc_timestamp": "records",
    "LogSink": "sink",
    "SinkStats": "sink",
    "LogWriterError": "writer",
    "RotatingLogWriter": "writer",
    "WriterStats": "writer",
}

__all__ = list(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'dflashd.logs' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"dflashd.logs.{module}"), name)
    globals()[name] = value
    return value
