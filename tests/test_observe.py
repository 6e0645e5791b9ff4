"""The observer, the loop's reader of the live run: what it reads while the drain threads write."""

from __future__ import annotations

import os
import sys
import threading
from collections import deque
from dataclasses import dataclass, field

from dflashd.supervisor.host.proof import SpawnedChild
from dflashd.supervisor.model.inputs import Input, LinesSeen
from dflashd.supervisor.model.progress import LineProgress
from dflashd.supervisor.watch.observe import TAIL_LINES, RunObserver
from dflashd.supervisor.watch.run import Run
from tests.tables import run_state


@dataclass
class Tail:
    """A drain as the observer reads it: its tail, appended to by its own thread."""

    tail: deque[str] = field(default_factory=lambda: deque(maxlen=2000))  # a long read


def appending(tail: deque[str], stop: threading.Event) -> None:
    while not stop.is_set():
        tail.append("step 1 loss nan")


def test_a_loss_lines_tail_is_read_whole_while_the_drain_appends_to_it() -> None:
    """A post with a loss carries the job's last lines (a divergence's alert says them): read
    while the drain thread appends, they are copied at once, never iterated as they change
    (a deque changed under a Python loop raises, and the loop's exception is the daemon's)."""
    drain, stop = Tail(), threading.Event()
    writer = threading.Thread(target=appending, args=(drain.tail, stop))
    handed: list[Input] = []
    observer = RunObserver(None, None, lambda _run, heard: handed.append(heard))  # type: ignore[arg-type]
    facts = run_state(0.0)
    run = Run(1, lambda _no: facts, SpawnedChild(os.getpid(), -1, -1), (drain,))  # type: ignore[arg-type]
    seen = LinesSeen(1, LineProgress(5, True, "pattern", loss=float("nan")), "step 5 loss nan")
    switching = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch as often as they can
    writer.start()
    try:
        for n in range(5000):
            assert observer.lines(run, seen, float(n))
    finally:
        stop.set()
        writer.join()
        sys.setswitchinterval(switching)
    tails = [heard.tail for heard in handed if isinstance(heard, LinesSeen)]
    assert len(tails) == 5000 and all(len(t) == TAIL_LINES for t in tails[100:])
