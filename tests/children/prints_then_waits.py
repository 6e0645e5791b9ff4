"""Prints a line, then waits to be stopped."""

import threading

print("hello from the job", flush=True)
threading.Event().wait()
