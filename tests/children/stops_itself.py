"""Prints, then stops itself (SIGSTOP) inside a recognisable function: a stall that cannot run."""

import os
import signal


def frozen_in_a_debugger() -> None:
    os.kill(os.getpid(), signal.SIGSTOP)
    signal.pause()


print("warming up", flush=True)
frozen_in_a_debugger()
