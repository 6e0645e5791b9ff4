"""The daemon's lifecycle as an explicit state machine (STYLE §3)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Final


class State(StrEnum):
    """What the daemon is doing (``status`` shows the value)."""

    STARTING = "starting"
    RUNNING = "running"
    BACKOFF = "backoff"
    FATAL = "fatal"
    STOPPING = "stopping"
    STOPPED = "stopped"
    COMPLETED = "completed"  # the job exited 0: the daemon's work is done


class Phase(StrEnum):
    """Where the current (or last) child is in its life."""

    LAUNCHING = "launching"
    WARMING_UP = "warming_up"
    TRAINING = "training"
    EXITED = "exited"


class IllegalTransition(RuntimeError):
    """A transition the table does not allow: a bug in the daemon, never user input."""


TRANSITIONS: Final[dict[State, frozenset[State]]] = {
    State.STARTING: frozenset(
        {State.RUNNING, State.BACKOFF, State.FATAL, State.STOPPING, State.STOPPED}
    ),
    State.RUNNING: frozenset(
        {State.BACKOFF, State.FATAL, State.STOPPING, State.STOPPED, State.COMPLETED}
    ),
    # BACKOFF -> FATAL: the relaunch's pre-flight found a GPU that needs a reset (preflight.py)
    State.BACKOFF: frozenset({State.STARTING, State.FATAL, State.STOPPING, State.STOPPED}),
    State.FATAL: frozenset({State.STOPPING, State.STOPPED}),
    State.STOPPING: frozenset({State.STOPPED}),
    State.STOPPED: frozenset(),
    State.COMPLETED: frozenset(),
}


def transition(current: State, target: State) -> State:
    """Return ``target`` if the edge ``current -> target`` is allowed; raise otherwise."""
    if target not in TRANSITIONS[current]:
        raise IllegalTransition(f"{current.value} -> {target.value}")
    return target


@dataclass(frozen=True, slots=True)
class LoopState:
    """The daemon's state, its exit code, and whether a stop was asked: replaced, never
    changed: :meth:`entered` (the table above) and :meth:`ended_with` return the next one."""

    state: State = State.STARTING
    exit_code: int = 0
    stop_requested: bool = False

    def entered(self, target: State) -> LoopState:
        """In ``target`` (itself when already there); an illegal edge raises."""
        if target is self.state:
            return self
        return replace(self, state=transition(self.state, target))

    def ended_with(self, code: int) -> LoopState:
        """The daemon will exit with ``code``."""
        return replace(self, exit_code=code)

    @property
    def done(self) -> bool:
        """The loop ends: stopped, fatal or completed."""
        return self.state in (State.STOPPED, State.FATAL, State.COMPLETED)
