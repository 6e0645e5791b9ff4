"""SIGTERM and SIGINT: stop at the next step boundary, or exit if that boundary never comes.

The loop checks ``Stop.event`` after each step, checkpoints and exits 0.  That needs the main
thread to get back to Python: Python runs signal handlers only between bytecodes of the main
thread, and a step can be stuck in C where it never does: a collective waiting for a peer
that died (NCCL waits up to ``--dist-timeout-s``), a hung kernel, a lock.  Under torchrun
that cost every surviving node 30 s per fault (the agent's SIGTERM went unanswered until its
SIGKILL).

So the signal is also seen where no bytecode has to run: the C-level handler writes the
signal number to a wakeup pipe (``signal.set_wakeup_fd``), and a watcher thread reading it
sets the event and arms a deadline.  If the loop has not reached its step boundary by then
(``grace_for``: a few of its recent steps' length, at most ``--stop-grace-s``), the process
says so on stderr and exits 128+signal at once (``os._exit``:
a thread stuck in a collective would hang an orderly shutdown), without a checkpoint; the
last periodic one stands.  A second signal exits at once.  Signal masks are left alone:
they would be inherited by the compile workers the trainer spawns.  Before the first step
(importing torch, building the model, compiling) nothing is in flight and nothing new would be
saved: a stop exits at once, and says what the trainer was doing (``Stop.doing``).
"""

from __future__ import annotations

import os
import signal
import threading
import time
import traceback
from collections import deque
from collections.abc import Iterable
from typing import Any

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
DEFAULT_GRACE_S = 10.0  # well under torchrun's 30 s and dflashd's default stop_timeout_s
MIN_GRACE_S = 2.0
STEPS_PER_GRACE = 5  # a step this many times longer than the slowest recent one is stuck
RECENT_STEPS = 20


def grace_for(recent_step_s: Iterable[float], cap_s: float) -> float:
    """How long the step in flight may take to reach its boundary before it counts as stuck.

    Before any step (setup, compile) the whole cap; after, a few times the slowest recent
    step (checkpoint saves included), never under ``MIN_GRACE_S`` nor over the cap.  On an
    H200 a step takes 75 ms: a node whose peer died is gone in 2 s, not 10.
    """
    slowest = max(recent_step_s, default=None)
    if slowest is None:
        return cap_s
    return min(cap_s, max(MIN_GRACE_S, STEPS_PER_GRACE * slowest))


class Stop:
    """The stop request: ``event`` for the loop, ``at_boundary()`` when the loop acts on it."""

    def __init__(self, grace_s: float = DEFAULT_GRACE_S) -> None:
        self.event = threading.Event()
        self.grace_s = grace_s
        self._boundary = threading.Event()
        self._lock = threading.RLock()  # the main thread's handler may run inside step_took
        self._signalled_before = False
        self._recent: deque[float] = deque(maxlen=RECENT_STEPS)
        # What the process is doing, for the stop message: set as the trainer moves on.
        self.doing = "starting"
        for signum in STOP_SIGNALS:
            signal.signal(signum, self._on_main_thread)
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        threading.Thread(
            target=self._watch, args=(read_fd,), name="stop-watcher", daemon=True
        ).start()

    def step_took(self, seconds: float) -> None:
        """One step's wall time, boundary to boundary (for ``grace_for``)."""
        with self._lock:
            self._recent.append(seconds)

    def at_boundary(self) -> None:
        """The loop reached a step boundary and is stopping: the deadline no longer applies."""
        self._boundary.set()

    def _on_main_thread(self, signum: int, _frame: Any) -> None:
        """Python's handler (main thread, whenever it gets back to bytecode).

        Installing it replaces the default action (terminate), and the C-level handler
        behind it writes every signal to the wakeup pipe.  Should anything replace that
        pipe, this still makes the request; the watcher alone counts a second signal.
        """
        self._request(signum)

    def _watch(self, read_fd: int) -> None:
        while True:
            try:
                data = os.read(read_fd, 64)
            except OSError:
                return
            if not data:
                return
            for signum in data:
                if signum in STOP_SIGNALS:
                    self._signalled(signum)

    def _signalled(self, signum: int) -> None:
        with self._lock:
            again, self._signalled_before = self._signalled_before, True
        if again:
            if not self._boundary.is_set():
                self._exit(signum, f"a second {signal.Signals(signum).name}: exiting now")
            return
        self._request(signum)

    def _request(self, signum: int) -> None:
        with self._lock:
            if self.event.is_set():
                return
            self.event.set()
        threading.Thread(
            target=self._deadline, args=(signum,), name="stop-deadline", daemon=True
        ).start()

    def bound_exit(self, code: int, error: BaseException | None, doing: str) -> None:
        """The outcome is decided; what is left (``doing``) must not hang the exit.

        Leaving a process group whose peer is gone can block (NCCL's teardown waits for
        it), which kept a stopped worker alive until its SIGKILL.  If the process is still
        here ``grace_for`` later it exits with ``code``, printing ``error`` first (the
        interpreter would have printed it on the way out).
        """
        grace_s = self._grace_now()

        def expire() -> None:
            time.sleep(grace_s)  # a plain timer: nothing can end it early but the exit itself
            if error is not None:
                os.write(2, "".join(traceback.format_exception(error)).encode())
            self._exit_code(code, f"exit: {doing} took over {grace_s:g}s: exiting {code} now")

        threading.Thread(target=expire, name="exit-deadline", daemon=True).start()

    def _grace_now(self) -> float:
        with self._lock:
            recent = list(self._recent)
        return grace_for(recent, self.grace_s)

    def _deadline(self, signum: int) -> None:
        with self._lock:
            stepped = bool(self._recent)
        if not stepped and not self._boundary.is_set():
            # Before the first step there is no step in flight to finish and nothing new to
            # save (the last checkpoint, if any, stands): stop now, saying what it was doing.
            name = signal.Signals(signum).name
            self._exit(signum, f"{name} while {self.doing}, before the first step: exiting now")
        grace_s = self._grace_now()
        if self._boundary.wait(grace_s):
            return
        self._exit(
            signum,
            f"no step boundary within {grace_s:g}s of {signal.Signals(signum).name} "
            "(a collective waiting for a peer that is gone, or a hung kernel?): exiting "
            "without a checkpoint; the last saved one stands",
        )

    @staticmethod
    def _exit(signum: int, why: str) -> None:
        Stop._exit_code(128 + signum, f"stop: {why}")

    @staticmethod
    def _exit_code(code: int, message: str) -> None:
        # os.write: no lock a stuck thread could hold; os._exit: no thread joins, no atexit.
        os.write(2, f"{message}\n".encode())
        os._exit(code)
