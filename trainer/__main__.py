"""``python -m dflashd.trainer``: the embedded default job of ``dflashd start``.

The entry point lives here, above the modules it uses (``train`` holds the configuration
and the command line, ``session`` the set-up, ``loop`` the training), so neither imports the other's caller.
"""

from __future__ import annotations

import signal
import sys
import threading

from dflashd.trainer.notify import Notifier
from dflashd.trainer.stopping import Stop
from dflashd.trainer.train import EX_CONFIG, RecompileBlocked, parse_args, say


def main(argv: list[str] | None = None) -> int:
    """Parse, apply the injected fault if any, train; the exit code."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    stop = Stop(args.stop_grace_s)  # from here a Ctrl-C or SIGTERM says what it interrupted
    # Speak the child protocol from the first instruction: the supervisor then knows it can
    # see this job's steps, so its first-step timeout applies (a silent hang is a stall).
    Notifier().send("STATUS=starting")
    inject = args.inject
    if inject.kind == "import_error":
        import dflashd_injected_missing_dependency  # type: ignore[import-not-found]  # noqa: F401
    if inject.kind == "hang_before_cuda":
        say("injected: hanging before CUDA initialisation")
        threading.Event().wait()
    import faulthandler

    faulthandler.register(signal.SIGUSR1, all_threads=True)  # a stack dump on demand, into the log
    stop.doing = "importing torch"
    from dflashd.trainer.session import run

    try:
        return run(args, stop, inject)
    except RecompileBlocked as exc:
        say(f"recompile_blocked: {exc}")
        return EX_CONFIG


if __name__ == "__main__":
    sys.exit(main())
