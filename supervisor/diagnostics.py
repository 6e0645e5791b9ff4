"""dflashd's own log (not the run log): structlog, rendered for where it goes.

- a terminal: structlog's console renderer, colours only on a TTY and never with NO_COLOR;
- the journal (``JOURNAL_STREAM`` set: systemd connected our stderr to journald): one
  ``key=value`` line per event behind an sd-daemon priority prefix (``<3>`` error, ``<4>``
  warning, ``<6>`` info, ``<7>`` debug), so ``journalctl -p err -u dflashd`` finds the crashes;
  journald adds the time;
- anything else (daemon.log for the detached daemon, a pipe): one JSON object per line.

Context is bound per run (``run``, ``pid``) with structlog's contextvars.  The run log keeps its
own schema on its fast path; this log is for dflashd's events and diagnostics.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, MutableMapping
from typing import Any, Final, Protocol, TextIO, cast

import orjson
import structlog

_LEVELS: Final = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}
# sd-daemon(3): <3> SD_ERR, <4> SD_WARNING, <6> SD_INFO, <7> SD_DEBUG.
JOURNAL_PRIORITY: Final = {"debug": 7, "info": 6, "warning": 4, "error": 3, "critical": 2}


def _json(obj: Any, **_kw: Any) -> str:
    return orjson.dumps(obj, default=str).decode()


class JournalRenderer:
    """``<6>event key=value …``: the priority prefix journald reads, then logfmt-like text."""

    def __init__(self) -> None:
        self._kv = structlog.processors.KeyValueRenderer(key_order=["event"], drop_missing=True)

    def __call__(self, logger: Any, name: str, event_dict: MutableMapping[str, Any]) -> str:
        level = str(event_dict.pop("level", "info"))
        return f"<{JOURNAL_PRIORITY.get(level, 6)}>{self._kv(logger, name, event_dict)}"


class LogStream(Protocol):
    """Where dflashd's own log goes: a text stream (stderr, or daemon.log's rotating stream)."""

    def write(self, text: str, /) -> int: ...
    def flush(self) -> None: ...
    def isatty(self) -> bool: ...


class SurvivingStream:
    """A log stream whose failures are counted, never raised (a closed terminal or journal).

    A foreground daemon whose stdout or stderr goes away (the terminal closed, journald
    restarted) must go on supervising: what cannot be written is counted in ``lost``.
    """

    def __init__(self, inner: LogStream) -> None:
        self.inner = inner
        self.lost = 0

    def write(self, text: str, /) -> int:
        try:
            return self.inner.write(text)
        except (OSError, ValueError):  # EPIPE, EIO; ValueError: the stream was closed
            self.lost += 1
            return len(text)

    def flush(self) -> None:
        try:
            self.inner.flush()
        except (OSError, ValueError):
            self.lost += 1

    def isatty(self) -> bool:
        try:
            return self.inner.isatty()
        except (OSError, ValueError):
            return False


def renderer_for(stream: LogStream, environ: Mapping[str, str]) -> Any:
    """The last processor: journal, console or JSON (see the module doc)."""
    if environ.get("JOURNAL_STREAM"):
        return JournalRenderer()
    if stream.isatty():
        return structlog.dev.ConsoleRenderer(colors="NO_COLOR" not in environ)
    return structlog.processors.JSONRenderer(serializer=_json)


def configure_logging(
    level: str = "info", stream: LogStream | None = None, environ: Mapping[str, str] | None = None
) -> None:
    """Route dflashd's own log to ``stream`` (stderr by default), rendered for it."""
    stream = SurvivingStream(stream or sys.stderr)
    environ = os.environ if environ is None else environ
    renderer = renderer_for(stream, environ)
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
    ]
    if not isinstance(renderer, JournalRenderer):
        processors.append(structlog.processors.TimeStamper(fmt="iso", utc=True))
    processors.append(renderer)
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        # PrintLogger needs only write() and flush(): any LogStream will do.
        logger_factory=structlog.PrintLoggerFactory(file=cast("TextIO", stream)),
        cache_logger_on_first_use=False,  # structlog.testing.capture_logs must see every call
    )


def get_logger(name: str = "dflashd") -> Any:
    """A structlog logger: ``log.info("event", key=value)``."""
    return structlog.get_logger(name)


def bind_run(**context: Any) -> None:
    """Bind ``run``/``pid`` to every later event of this thread (the loop)."""
    structlog.contextvars.bind_contextvars(**context)
