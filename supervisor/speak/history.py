"""runs.sqlite: one row per run, so ``status`` can show restarts by verdict and a crash loop's story."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from pathlib import Path
from typing import Any

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run INTEGER PRIMARY KEY,
    started_at REAL NOT NULL,
    ended_at REAL,
    pid INTEGER,
    argv TEXT,
    verdict TEXT,
    reason TEXT,
    exit_code INTEGER,
    signal TEXT,
    first_step_s REAL,
    last_step INTEGER
)
"""
# The goodput ledger's settled totals (one row): a later daemon goes on from them.
_GOODPUT_SCHEMA = """
CREATE TABLE IF NOT EXISTS goodput (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    first_start REAL NOT NULL,
    totals TEXT NOT NULL,
    daemon_ended INTEGER NOT NULL,
    saved_at REAL NOT NULL
)
"""


def _create_private(path: Path) -> None:
    """Make the file 0600 before sqlite opens it (sqlite would make it 0644 under the usual
    umask, and gives its -wal and -shm files the database's mode); an older, wider one is
    narrowed.  Never through a symlink."""
    _narrow(os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
    for suffix in ("-wal", "-shm", "-journal"):
        with contextlib.suppress(OSError):
            side = path.with_name(path.name + suffix)
            _narrow(os.open(side, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC))


def _narrow(fd: int) -> None:
    try:
        if os.fstat(fd).st_mode & 0o077:
            os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


PRUNE_EVERY = 100  # runs between two prunings of the oldest rows


class RunHistory:
    """A small wrapper; every call is one short transaction.

    Retention: the newest ``keep_runs`` runs (``logs.history_runs``); older rows are deleted
    every ``PRUNE_EVERY`` launches, so a crash loop running all night keeps the file bounded.
    """

    def __init__(self, path: Path, keep_runs: int = 100_000) -> None:
        self.keep_runs = keep_runs
        _create_private(path)
        self._db = sqlite3.connect(path, timeout=2.0, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        # No fsync per commit: the history is a convenience, and the death-to-relaunch path must stay fast.
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA cache_size=-256")  # 256 KiB: a few hundred rows need no more
        self._db.execute(_SCHEMA)
        self._db.execute(_GOODPUT_SCHEMA)

    def last_run(self) -> int:
        """The highest run number recorded (0 when none)."""
        row = self._db.execute("SELECT MAX(run) FROM runs").fetchone()
        return int(row[0] or 0)

    def started(self, run: int, started_at: float, pid: int | None, argv: str) -> None:
        """Record a launch (pid None for a launch that failed to exec)."""
        self._db.execute(
            "INSERT OR REPLACE INTO runs (run, started_at, pid, argv) VALUES (?, ?, ?, ?)",
            (run, started_at, pid, argv),
        )
        if run % PRUNE_EVERY == 0:
            self._db.execute("DELETE FROM runs WHERE run <= ?", (run - self.keep_runs,))

    def ended(
        self,
        run: int,
        *,
        ended_at: float,
        verdict: str,
        reason: str,
        exit_code: int | None,
        signal: str | None,
        first_step_s: float | None,
        last_step: int | None,
    ) -> None:
        """Record how a run ended."""
        self._db.execute(
            "UPDATE runs SET ended_at=?, verdict=?, reason=?, exit_code=?, signal=?, first_step_s=?, "
            "last_step=? WHERE run=?",
            (ended_at, verdict, reason, exit_code, signal, first_step_s, last_step, run),
        )

    def save_goodput(
        self, first_start: float, totals: dict[str, Any], *, daemon_ended: bool, saved_at: float
    ) -> None:
        """Replace the goodput row (``daemon_ended``: this daemon ended, it did not die)."""
        self._db.execute(
            "INSERT OR REPLACE INTO goodput (id, first_start, totals, daemon_ended, saved_at) "
            "VALUES (1, ?, ?, ?, ?)",
            (first_start, json.dumps(totals), int(daemon_ended), saved_at),
        )

    def goodput(self) -> tuple[float, Any, bool] | None:
        """The saved (first start, totals as stored, whether that daemon ended), or None."""
        try:  # a damaged or locked file: the ledger starts afresh, the start goes on
            row = self._db.execute(
                "SELECT first_start, totals, daemon_ended FROM goodput WHERE id = 1"
            ).fetchone()
        except sqlite3.Error:
            return None
        if row is None or not isinstance(row[0], int | float) or not isinstance(row[1], str):
            return None
        if len(row[1]) > 65536:  # a few totals: anything larger is not ours
            return None
        try:
            totals = json.loads(row[1])
        except ValueError:
            return None
        return float(row[0]), totals, bool(row[2])

    def close(self) -> None:
        """Close the database."""
        self._db.close()


def open_history(path: Path, keep_runs: int = 100_000) -> RunHistory | None:
    """The history, or None when it cannot be opened safely (status then simply shows less).

    sqlite follows symlinks: a link planted at runs.sqlite (or its -wal/-shm) is refused.
    """
    for name in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        if name.is_symlink():
            return None
    try:
        return RunHistory(path, keep_runs)
    except (sqlite3.Error, OSError):
        return None


def recorded_runs(path: Path) -> list[int]:
    """The run numbers in a history file, read-only (empty when there is none or it is unreadable)."""
    if not path.is_file() or path.is_symlink():
        return []
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1.0)
        try:
            return [int(row[0]) for row in db.execute("SELECT run FROM runs ORDER BY run")]
        finally:
            db.close()
    except sqlite3.Error:
        return []
