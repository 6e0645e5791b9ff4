"""One run: a launch of the job, from ``spawn`` to ``exit`` (in the spirit of Supervisor's process.py).

A :class:`Run` holds the shell's handles on one child: its number (``run_no``), its launch
(pid, pipes, custody), its drains and the torchrun agent's watcher.  What the daemon knows of
it is ``run.facts`` (:class:`~dflashd.supervisor.model.runstate.RunState`), a value the
model keeps and replaces.  ``alive`` and ``belongs(pid)`` are the two questions the rest of
the daemon asks of it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from dflashd.logs.drain import PipeDrain
from dflashd.supervisor.host.proof import RunCustody, SpawnedChild
from dflashd.supervisor.model.lifecycle import Phase
from dflashd.supervisor.model.runstate import RunState


class StepWatcher(Protocol):
    """The drains' callback as the loop sees it (:class:`~dflashd.supervisor.watch.linewatch.LineWatcher`)."""

    def due(self) -> float | None:
        """When a pending step must be posted even if no more output comes (monotonic)."""
        ...

    def flush_if_due(self, now: float) -> bool:
        """Post a pending step whose time has come; True when something was posted."""
        ...

    def flush(self) -> None:
        """Post what is pending (the child is dead)."""
        ...


# Where a run's facts are kept: run number -> its facts, as the model has them now (the core's
# :meth:`~dflashd.supervisor.core.DaemonCore.facts_of`).
FactsBook = Callable[[int], RunState]


@dataclass(eq=False)
class Run:
    """The shell's side of the current (or last) child: its handles.  What is known of it
    (its progress, evidence, who ended it) is ``facts``, a value the model keeps."""

    run_no: int
    book: FactsBook
    launched: SpawnedChild | None = None
    drains: tuple[PipeDrain, ...] = ()
    watcher: StepWatcher | None = None  # the drains' callback; flushed when the child dies
    reaped: bool = False  # its wait status was taken: the run is over (the one change)

    @property
    def facts(self) -> RunState:
        """What the model knows of this run now."""
        return self.book(self.run_no)

    @property
    def pid(self) -> int | None:
        """The child's pid (also its process group), once launched."""
        return self.launched.pid if self.launched is not None else None

    @property
    def phase(self) -> Phase:
        """Where the child is in its life, from what is known of it (never set: derived)."""
        facts = self.facts
        if self.reaped or facts.spawn_error is not None:
            return Phase.EXITED
        if self.launched is None:
            return Phase.LAUNCHING
        return Phase.TRAINING if facts.progress.reached_first_step else Phase.WARMING_UP

    @property
    def alive(self) -> bool:
        """SpawnedChild and not yet reaped."""
        return self.launched is not None and not self.reaped

    @property
    def custody(self) -> RunCustody | None:
        """The run's processes, proven (its cgroup or pidfds): the only way to signal them."""
        return self.launched.custody if self.launched is not None else None

    def belongs(self, pid: int) -> bool:
        """Is ``pid`` part of this run, proven (cgroup membership, or pidfd proof)?

        The one test behind notify senders and GPU holders; signals always go through the
        custody's proof.
        """
        custody = self.custody
        if custody is None:
            return False
        if pid == self.pid and self.alive:
            return True  # our unreaped child: its pid cannot have been reused
        return custody.owns(pid)
