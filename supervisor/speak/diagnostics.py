"""dflashd's own log (not the run log): events as snake_case facts with key-value fields,
rendered for where they go.

- a terminal: ``time [level] event key=value``, colours only on a TTY and never with NO_COLOR;
- the journal (``JOURNAL_STREAM`` set: systemd connected our stderr to journald): one
  ``key=value`` line per event behind an sd-daemon priority prefix (``<3>`` error, ``<4>``
  warning, ``<6>`` info, ``<7>`` debug), so ``journalctl -p err -u dflashd`` finds the crashes;
  journald adds the time;
- anything else (daemon.log for the detached daemon, a pipe): one JSON object per line.

Context is bound once per run (``run``, ``pid``) through structlog's context variables.  The
run log keeps its own schema on its fast path; this log is for dflashd's events and diagnostics.

structlog (the project's logging library) carries every event: its bound logger filters by
level, ``merge_contextvars`` adds the run's context, and the last processor is one of the three
renderers here.  It is imported when the daemon configures its log (:func:`configure_logging`,
before the first launch), not with this module: the CLI's commands that log nothing
(``status``, ``--help``) do not pay its import, which brings asyncio (and rich, where
installed).  What it costs the idle daemon is measured by
``tests/perf/idle_cost.py`` (docs/measurements.md).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from typing import Any, Final, Protocol

from dflashd.logs.records import utc_timestamp
from dflashd.logs.safejson import dumps_any
from dflashd.supervisor.speak.fieldtext import value_text

_LEVELS: Final = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}
# sd-daemon(3): <3> SD_ERR, <4> SD_WARNING, <6> SD_INFO, <7> SD_DEBUG.
JOURNAL_PRIORITY: Final = {"debug": 7, "info": 6, "warning": 4, "error": 3, "critical": 2}
_LEVEL_COLOURS: Final = {
    "debug": "\x1b[34m",
    "info": "\x1b[32m",
    "warning": "\x1b[33m",
    "error": "\x1b[31;1m",
    "critical": "\x1b[31;1m",
}

Renderer = Callable[[str, str, dict[str, Any]], str]  # (level, event, fields) -> one line


def _utc_now() -> str:
    return utc_timestamp(time.time())


def render_journal(level: str, event: str, fields: dict[str, Any]) -> str:
    """``<6>event='launched' run=4 pid=99``: the priority prefix journald reads, then key=repr."""
    pairs = " ".join(f"{key}={value!r}" for key, value in fields.items())
    return f"<{JOURNAL_PRIORITY.get(level, 6)}>event={event!r}" + (f" {pairs}" if pairs else "")


def render_json(level: str, event: str, fields: dict[str, Any]) -> str:
    """One JSON object: the fields, then ``event``, ``level`` and a UTC ``timestamp``."""
    record = {**fields, "event": event, "level": level, "timestamp": _utc_now()}
    return dumps_any(record).decode()


def console_renderer(colours: bool) -> Renderer:
    """``2026-12-01T12:00:00.000000Z [error    ] exit  run=3 verdict=crashed``."""
    dim, bright, key_colour, reset = (
        ("\x1b[2m", "\x1b[1m", "\x1b[36m", "\x1b[0m") if colours else ("", "", "", "")
    )

    def render(level: str, event: str, fields: dict[str, Any]) -> str:
        shade = _LEVEL_COLOURS.get(level, "") if colours else ""
        pairs = " ".join(
            f"{key_colour}{key}{reset}={value if isinstance(value, str) else repr(value)}"
            for key, value in fields.items()
        )
        return (
            f"{dim}{_utc_now()}{reset} [{shade}{level:<9}{reset}] {bright}{event:<24}{reset} {pairs}"
        ).rstrip()

    return render


def prefixed_renderer(colours: bool) -> Renderer:
    """``r1 dflashd | launched pid=99 custody=cgroup``: the foreground's one format, beside the
    job's own ``r1 out | ...`` lines (into a terminal or a pipe, ``| tee train.log``)."""
    dim, reset = ("\x1b[2m", "\x1b[0m") if colours else ("", "")

    def render(level: str, event: str, fields: dict[str, Any]) -> str:
        run = fields.pop("run", None)
        if event != "launched":
            fields.pop("pid", None)  # the run's bound context: said once, at its launch
        shade = _LEVEL_COLOURS.get(level, "") if colours and level != "info" else ""
        said = f"{level}: " if level not in ("info", "debug") else ""
        pairs = " ".join(
            f"{key}={value if isinstance(value, str) else value_text(value)}"
            for key, value in fields.items()
            if value is not None
        )
        head = f"{dim}r{run if run is not None else 0} dflashd |{reset} "
        return f"{head}{shade}{said}{event}{reset} {pairs}".rstrip()

    return render


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


def renderer_for(stream: LogStream, environ: Mapping[str, str]) -> Renderer:
    """The renderer for ``stream``: journal, console or JSON (see the module doc)."""
    if environ.get("JOURNAL_STREAM"):
        return render_journal
    if stream.isatty():
        return console_renderer(colours="NO_COLOR" not in environ)
    return render_json


class _LogSink:
    """Where events go now: a stream and its renderer, above a level (or a capture list)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.stream: LogStream = SurvivingStream(sys.stderr)
        self.render: Renderer = renderer_for(self.stream, os.environ)
        self.min_level = _LEVELS["info"]
        self.captured: list[dict[str, Any]] | None = None
        self.configured_level: int | None = None  # structlog configured for this level

    def write(self, line: str) -> None:
        with self.lock:
            self.stream.write(line + "\n")
            self.stream.flush()


_SINK: Final = _LogSink()


class _SinkWriter:
    """structlog's "logger": takes the rendered line, writes it to the sink's stream."""

    def msg(self, line: str) -> None:
        _SINK.write(line)

    debug = info = warning = error = critical = msg


def _render_processor(_logger: object, method: str, event_dict: MutableMapping[str, Any]) -> str:
    """structlog's last processor: capture (tests) or render for the stream."""
    event = str(event_dict.pop("event", ""))
    level = "warning" if method == "warn" else method
    captured = _SINK.captured
    if captured is not None:
        captured.append({**event_dict, "event": event, "log_level": level})
        import structlog

        raise structlog.DropEvent
    return _SINK.render(level, event, dict(event_dict))


# Pretty-traceback packages structlog's dev module imports where they are installed (rich
# brings pygments and asyncio): 4 MiB of the daemon's memory and a tenth of a second of its
# start, for a renderer dflashd never uses (issue 53: idle and flood RSS).  And ssl, which
# structlog.stdlib's asyncio imports where it can (it works without: dflashd never opens a TLS
# stream through asyncio) and which loads OpenSSL's libssl and libcrypto: 3.6 MiB resident.
_PRETTY_TRACEBACKS: Final = ("rich", "better_exceptions", "ssl")


def _import_structlog() -> Any:
    """``import structlog`` with the pretty-traceback packages hidden for that one import,
    where nothing imported them yet; they import as usual afterwards."""
    if "structlog" in sys.modules:
        return sys.modules["structlog"]
    hidden = [name for name in _PRETTY_TRACEBACKS if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # type: ignore[assignment]  # import raises ImportError
    try:
        import structlog
    finally:
        for name in hidden:
            if sys.modules.get(name) is None:
                del sys.modules[name]
    return structlog


def _structlog(level: int) -> Any:
    """structlog, configured for ``level`` (imported and configured on first use)."""
    structlog = _import_structlog()
    if _SINK.configured_level != level:
        structlog.configure(
            processors=[structlog.contextvars.merge_contextvars, _render_processor],
            wrapper_class=structlog.make_filtering_bound_logger(level),
            logger_factory=lambda *_args: _SinkWriter(),
            cache_logger_on_first_use=False,
        )
        _SINK.configured_level = level
    return structlog


def configure_logging(
    level: str = "info",
    stream: LogStream | None = None,
    environ: Mapping[str, str] | None = None,
    *,
    foreground: bool = False,
) -> None:
    """Route dflashd's own log to ``stream`` (stderr by default), rendered for it;
    ``foreground``: beside the job's echoed lines, in their one prefixed format (the journal
    still gets its own)."""
    surviving = SurvivingStream(stream or sys.stderr)
    env = os.environ if environ is None else environ
    renderer = renderer_for(surviving, env)
    if foreground and not env.get("JOURNAL_STREAM"):
        renderer = prefixed_renderer(surviving.isatty() and "NO_COLOR" not in env)
    with _SINK.lock:
        _SINK.stream, _SINK.render, _SINK.min_level = surviving, renderer, _LEVELS[level]
    # structlog now, not on the first event: that one comes right after the first fork, where
    # 0.1 s of imports would delay the loop reading the child's first notify messages
    _structlog(_LEVELS[level])


class Logger:
    """``log.info("event", key=value)``: one event, its fields, the bound context (structlog)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def _emit(self, level: str, event: str, fields: dict[str, Any]) -> None:
        capturing = _SINK.captured is not None  # tests see every level
        floor = _LEVELS["debug"] if capturing else _SINK.min_level
        logger = _structlog(floor).get_logger(self.name)
        getattr(logger, level)(event, **fields)

    def debug(self, event: str, **fields: Any) -> None:
        """An event at debug level."""
        self._emit("debug", event, fields)

    def info(self, event: str, **fields: Any) -> None:
        """An event at info level."""
        self._emit("info", event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        """An event at warning level."""
        self._emit("warning", event, fields)

    def error(self, event: str, **fields: Any) -> None:
        """An event at error level."""
        self._emit("error", event, fields)

    def critical(self, event: str, **fields: Any) -> None:
        """An event at critical level."""
        self._emit("critical", event, fields)


def get_logger(name: str = "dflashd") -> Logger:
    """A logger: ``log.info("event", key=value)``."""
    return Logger(name)


def bind_run(**context: Any) -> None:
    """Bind ``run``/``pid`` to every later event of this context (the loop's thread)."""
    _structlog(_SINK.min_level).contextvars.bind_contextvars(**context)


@contextlib.contextmanager
def capture_logs() -> Iterator[list[dict[str, Any]]]:
    """Every event inside the block as a dict (``log_level`` added), none written: for tests."""
    captured: list[dict[str, Any]] = []
    with _SINK.lock:
        previous, _SINK.captured = _SINK.captured, captured
    try:
        yield captured
    finally:
        with _SINK.lock:
            _SINK.captured = previous
