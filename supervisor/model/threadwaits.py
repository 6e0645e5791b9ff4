"""What a thread is waiting on, from its stack (pure, a leaf of the hang decider).

A thread whose innermost Python frame is a wait (a lock, a sleep, a selector, a socket, a
collective) waits on the CPU side; one in a CUDA synchronize or a tensor read back waits for
its GPU; anything else runs.  :mod:`hang` judges rounds of samples from this.
"""

from __future__ import annotations

import re
from enum import Enum
from typing import Final

from dflashd.supervisor.model.stacks import StackFrame, ThreadStack

# A thread whose innermost Python frame is one of these waits for something else: a lock,
# a condition, a sleep, a selector, a socket, a child, a collective, a CUDA synchronize.
_WAIT_NAME: Final = re.compile(
    r"(?:^|_)(?:wait\w*|sleep|acquire|join|select|poll|epoll|kqueue|recv\w*|accept|"
    r"read(?:line|into|exactly)?|communicate|waitpid|synchroni[sz]e|barrier|"
    r"lock|_wait_for_tstate_lock)$",
    re.IGNORECASE,
)


# A thread waiting for its GPU: a CUDA synchronize, or a tensor read back to the host.  A
# GPU-bound loop sits there nearly all the time too, so such a wait is a hang only when
# the run's GPUs are idle, or when another process of the run waits on the CPU side (the
# classic NCCL hang: one rank frozen, the others spinning in their GPU).
_GPU_WAIT_NAME: Final = re.compile(
    r"synchroni[sz]e|cuda\w*Synchronize|_local_scalar_dense|^item$|^tolist$|^cpu$",
    re.IGNORECASE,
)


class WaitKind(Enum):
    """What a thread is doing in one sample."""

    CPU = "cpu"  # waits on a lock, a sleep, a selector, a socket, a collective
    GPU = "gpu"  # waits for its GPU
    NONE = "none"  # runs (or sits in a frame that is no wait)


def waiting_on(thread: ThreadStack) -> WaitKind:
    """Whether, and on what, the thread waits (its innermost frame, or a collective)."""
    if not thread.frames:
        return WaitKind.CPU if not thread.active else WaitKind.NONE
    if any(frame.collective for frame in thread.frames):
        return WaitKind.CPU  # a collective waits for its peers
    top: StackFrame = thread.frames[0]
    if _GPU_WAIT_NAME.search(top.name):
        return WaitKind.GPU
    if _WAIT_NAME.search(top.name) or not thread.active:
        return WaitKind.CPU
    return WaitKind.NONE


def waiting(thread: ThreadStack) -> bool:
    """The thread sits in a wait of either kind."""
    return waiting_on(thread) is not WaitKind.NONE
