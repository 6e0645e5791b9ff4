"""A job whose function and file names carry terminal escapes (a window title, an OSC 52
clipboard write): what py-spy reads from its memory and ``dflashd stacks`` prints."""

import time

from _notify import notify

EVIL = "\x1b]0;pwned\x07\x1b]52;c;ZWNobyBwd25lZA==\x07"


def loop() -> None:
    step = 1
    while True:
        step += 1
        notify(f"STEP={step}")
        time.sleep(0.2)


loop.__code__ = loop.__code__.replace(co_name="train" + EVIL, co_filename="evil" + EVIL + ".py")
notify("READY=1\nSTEP=1")
print("ready", flush=True)
loop()
