"""The loop's inbox: messages from threads, and signals, through one wake pipe.

Threads (pipe drains, the GPU poller) never call into the loop: they :meth:`Inbox.post` a
small message and write a byte to the wake pipe.  Signal handlers do nothing at all:
``signal.set_wakeup_fd`` writes the signal number to the same pipe, and the loop reads it
back with :meth:`Inbox.signals`.
"""

from __future__ import annotations

import os
import queue
import select
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

from dflashd.supervisor.host.handover import TERMINAL_STOPS
from dflashd.supervisor.model.hang import HangSampled
from dflashd.supervisor.model.inputs import LinesSeen
from dflashd.supervisor.model.stacks import StacksTaken
from dflashd.supervisor.watch.nvml import GpuSample

_WAKE: Final = b"\x00"
# Every signal whose default would end or stop the daemon silently gets a handler that does
# nothing (a handler, not SIG_IGN: the job must not inherit an ignored signal across exec);
# the loop decides what each means (docs/design.md, "Signals").
HANDLED_SIGNALS: Final = (
    signal.SIGCHLD,
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGQUIT,
    signal.SIGHUP,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGALRM,
    signal.SIGVTALRM,
    signal.SIGPROF,
    signal.SIGIO,
    signal.SIGPWR,
    signal.SIGXCPU,  # a soft RLIMIT_CPU reached: a long-lived daemon must not die of it
    *((signal.SIGSTKFLT,) if hasattr(signal, "SIGSTKFLT") else ()),  # Linux's unused one
    # the real-time signals: no program sends the daemon one on purpose
    *(range(signal.SIGRTMIN, signal.SIGRTMAX + 1) if hasattr(signal, "SIGRTMIN") else ()),
)
# Not SIGTTIN/SIGTTOU: a caught SIGTTOU makes a background write to a terminal with tostop
# retry forever; their default (stop) is what a shell's job control expects.


@dataclass(frozen=True, slots=True)
class GpuSampled:
    """From the GPU poller thread: one sample of every GPU."""

    sample: GpuSample


@dataclass(frozen=True, slots=True)
class RunEmptied:
    """From a custody watcher: nothing of the dead run ``run_no`` is left (cgroup.events)."""

    run_no: int


@dataclass(frozen=True, slots=True)
class LoopPing:
    """From the health endpoint: answered (``answered`` set) when the loop next reads its
    inbox, so a loop that stopped turning is seen without any periodic wake-up."""

    answered: threading.Event


Message = LinesSeen | GpuSampled | RunEmptied | StacksTaken | HangSampled


class Inbox:
    """A queue plus a non-blocking wake pipe the selector watches."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Message | LoopPing] = queue.SimpleQueue()
        self.read_fd, self._write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.stop_signals: frozenset[int] = _STOPS  # what the loop takes for a stop

    def ping(self) -> threading.Event:
        """From any thread: an event the loop sets when it next reads the inbox."""
        answered = threading.Event()
        self.post(LoopPing(answered))
        return answered

    def post(self, message: Message | LoopPing) -> None:
        """From any thread: queue a message and wake the loop."""
        self._queue.put(message)
        try:
            os.write(self._write_fd, _WAKE)
        except BlockingIOError:
            pass  # the pipe is full, so the loop is awake anyway

    def post_gpu(self, sample: GpuSample) -> None:
        """The GPU poller's delivery callback."""
        self.post(GpuSampled(sample))

    def messages(self) -> Iterator[Message]:
        """Everything queued now."""
        while True:
            try:
                message = self._queue.get_nowait()
            except queue.Empty:
                return
            if isinstance(message, LoopPing):
                message.answered.set()  # the loop turns: that is all a ping asks
                continue
            yield message

    def signals(self) -> set[int]:
        """The signal numbers the wake pipe carried since the last read (wake bytes are 0)."""
        try:
            data = os.read(self.read_fd, 4096)
        except BlockingIOError:
            return set()
        return set(data) - {0}

    def stop_first(self, signals: set[int], child: int | None) -> list[int]:
        """The signals in the order the loop acts on them: a stop before a death.  A child that
        died of SIGTERM, SIGINT or SIGHUP while no stop was asked: a scheduler signals a whole
        process tree at once (Slurm's ``scancel`` and time limit, a terminal's Ctrl-C), and its
        signal to dflashd may be a moment behind the child's death; it is waited for, up to
        :data:`STOP_BEHIND_S`, so the run ends ``stopped``, not ``crashed`` and relaunched."""
        got = set(signals)
        stops = self.stop_signals
        if signal.SIGCHLD in got and not got & stops and child is not None and _died_of_stop(child):
            deadline = time.monotonic() + STOP_BEHIND_S
            while not got & stops and (left := deadline - time.monotonic()) > 0:
                if select.select([self.read_fd], [], [], left)[0]:
                    got |= self.signals()
        return sorted(got, key=lambda signum: signum == signal.SIGCHLD)

    def catch_signals(self) -> None:
        """Route the handled signals to the wake pipe; their handlers do nothing.

        SIGTERM stops the daemon, and so do a terminal's Ctrl-C and Ctrl-\\ (SIGINT, SIGQUIT:
        supervisord reads them so too), unless the daemon began with them ignored: a script's
        background job does, and keeps them so as shells expect.  Only ``start --foreground &``
        can (``start`` gives the detached daemon their defaults, so ``kill -INT`` stops it
        whoever ran ``start``).  Their handlers still do nothing: the job inherits no ignore."""
        ignored = {s for s in TERMINAL_STOPS if signal.getsignal(s) is signal.SIG_IGN}
        self.stop_signals = _STOPS - ignored
        signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        for signum in HANDLED_SIGNALS:
            signal.signal(signum, _no_op_handler)
        # a mask inherited blocked (a client spawning us with Ctrl-C held back, a service
        # manager) would keep them from ever arriving
        signal.pthread_sigmask(signal.SIG_UNBLOCK, set(HANDLED_SIGNALS))

    def close(self) -> None:
        """Stop routing signals here and close the pipe."""
        try:
            signal.set_wakeup_fd(-1)
        except ValueError:
            pass  # not the main thread: nothing was routed here
        for fd in (self.read_fd, self._write_fd):
            os.close(fd)


STOP_BEHIND_S: Final = 0.5  # how long a child's death by a stop signal waits for dflashd's own
_STOPS: Final = frozenset({signal.SIGTERM, *TERMINAL_STOPS})


def _died_of_stop(pid: int) -> bool:
    """The child is dead of SIGTERM, SIGINT or SIGHUP (looked at, not reaped: WNOWAIT)."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    stops = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    return info is not None and info.si_code == os.CLD_KILLED and info.si_status in stops


def _no_op_handler(_signum: int, _frame: Any) -> None:
    """The wakeup fd carries the signal; the handler itself must do nothing."""
