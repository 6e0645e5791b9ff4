"""The contract the parts write through, in a leaf: :class:`Recorder`.

:class:`~dflashd.supervisor.speak.reporter.Reporter` implements it over the run log, alerts and
runs.sqlite; the parts (the core, the runs, the launcher, the observer, the live run's
control, the ended runs, the stack dumps) know only this, so importing one of them does not
pull in the log writer's floors.  Stdlib and leaves only.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from dflashd.logs.drain import FrameSink
from dflashd.supervisor.model.events import Event
from dflashd.supervisor.model.verdicts import AlertKind
from dflashd.supervisor.speak.history import RunHistory


class Recorder(Protocol):
    """One verb for a record, and the few other things the parts tell the outside world."""

    @property
    def log_path(self) -> Path:
        """The live run log."""
        ...

    @property
    def frames(self) -> FrameSink:
        """Where the drains hand the child's output (the run log's sink)."""
        ...

    def record(
        self,
        run_no: int,
        event: Event,
        /,
        *,
        log_level: str | None = None,
        wait_s: float | None = None,
        **fields: Any,
    ) -> int:
        """Write one ``dflashd`` record; ``wait_s``: wait that long for it to be on disk."""
        ...

    def flush(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for everything submitted to be on disk."""
        ...

    def alert(
        self,
        run_no: int,
        step: int | None,
        kind: AlertKind,
        reason: str,
        fields: dict[str, Any],
        gpus: list[dict[str, Any]],
    ) -> None:
        """Hand one alert to the sinks (returns at once)."""
        ...

    def record_history(self, write: Callable[[RunHistory], None]) -> None:
        """Write to runs.sqlite, degrading on a full disk or a broken file (never raises)."""
        ...

    def last_run_seen(self) -> int:
        """The highest run number the log and runs.sqlite know (0: none)."""
        ...

    def helper_pids(self) -> set[int]:
        """Our own helpers' pids (alert commands, the compressor, py-spy)."""
        ...

    def stack_dump_written(self) -> None:
        """Count one stack dump (metrics)."""
        ...
