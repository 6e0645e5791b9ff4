"""Prints the NOTIFY_SOCKET it was given, reports READY, then idles."""

import os
import threading

from _notify import notify

print(f"child NOTIFY_SOCKET={os.environ.get('NOTIFY_SOCKET')}", flush=True)
print(f"child WATCHDOG_USEC={os.environ.get('WATCHDOG_USEC')}", flush=True)
notify("READY=1\nSTEP=1")
threading.Event().wait()
