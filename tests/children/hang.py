"""Prints one line and then hangs forever in a recognisable function (for the stack dump)."""

import threading


def wait_for_a_collective_that_never_comes() -> None:
    threading.Event().wait()


print("warming up", flush=True)
wait_for_a_collective_that_never_comes()
