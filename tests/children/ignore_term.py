"""Ignores SIGTERM (so only SIGKILL ends it) and says when it is ready.

It prints before it notifies, and never writes again: a test that kills the daemon as soon as
the first step is seen must find this child still alive.  (Printed after the notify, the line
could meet a pipe whose daemon was just killed: Python ignores SIGPIPE, so the print raised
BrokenPipeError and the child died, and the next daemon had no leftover to end.)
"""

import signal
import threading

from _notify import notify

signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ignoring SIGTERM", flush=True)
notify("READY=1\nSTEP=1")
threading.Event().wait()
