"""dflashd.supervisor: the daemon, its decisions and the ``dflashd`` command line.

Three layers (docs/design.md, "The house"):

- :mod:`~dflashd.supervisor.model`: the pure model: the daemon's state, the inputs the loop
  hears, the effects it asks for, ``step`` and every decision (standard library only, no I/O);
- the adapters: :mod:`~dflashd.supervisor.host` (processes, custody, signals, cgroups, /proc,
  the home, the config file), :mod:`~dflashd.supervisor.watch` (the run's output, progress,
  GPUs, torchrun, stacks) and :mod:`~dflashd.supervisor.speak` (records, alerts, metrics, the
  control socket), each turning what it sees into the model's inputs;
- the shell, here: the loop (``daemon``), the one executor of effects (``core``), and a run's
  life between launches (``runs``, ``liverun``, ``launcher``, ``reaped``, ``endedruns``).

:mod:`~dflashd.supervisor.client` is the command line; nothing in the daemon imports it.
"""

import os as _os
import sys as _sys

__version__ = "0.5.0"
EXIT_INTERRUPTED = 130  # as dflashd.supervisor.model.exitcodes, not imported yet here


def interrupted_while_loading(signum: int, frame: object) -> None:
    """SIGINT before the ``dflashd`` command has taken over (its modules still loading):
    nothing was done yet; one line and exit 130, never a traceback (``__main__`` says why)."""
    signals = _sys.modules.get("_signal") or _sys.modules["signal"]  # loaded: no import here
    signals.signal(signals.SIGINT, signals.SIG_IGN)
    _os.write(2, b"\ndflashd: interrupted before it started: nothing was done\n")
    _os._exit(EXIT_INTERRUPTED)


def hold_ctrl_c_while_loading() -> None:
    """Set :func:`interrupted_while_loading` for SIGINT, unless the command was started with
    SIGINT ignored (a script's background job keeps it ignored)."""
    # the C module CPython loaded at start to install its own SIGINT handler: set through it
    # with no import (``signal`` first builds its enums: milliseconds on a cold cache, in which
    # a Ctrl-C was a traceback from enum.py)
    signals = _sys.modules.get("_signal") or __import__("signal")
    if signals.getsignal(signals.SIGINT) != signals.SIG_IGN:
        signals.signal(signals.SIGINT, interrupted_while_loading)


def _the_command_is_loading(argv: list[str]) -> bool:
    """This process is the ``dflashd`` command, still loading: ``python -m dflashd.supervisor``
    (runs this first, while ``-m`` finds its module: sys.argv is ``["-m", …]`` then), the
    ``dflashd`` script, or ``python -m dflashd`` (its ``__main__.py``).  Not the daemon program
    (``--handover-fd``: exec'd with its stop signals held, it sets its own), not an import."""
    first = argv[0] if argv else ""
    if first == "-m":
        return argv[1:2] != ["--handover-fd"]
    return _os.path.basename(first) == "dflashd" or first.endswith(
        _os.path.join("dflashd", "__main__.py")
    )


# The command's Ctrl-C is held from here, the first of dflashd that runs, not first from
# ``__main__`` (a Ctrl-C in between was a traceback from runpy: seen once in CI).
if _the_command_is_loading(_sys.argv):
    hold_ctrl_c_while_loading()

# The daemon program (``python -P -m dflashd.supervisor.daemon --handover-fd N …``, what
# ``start`` execs with its stop signals held) makes ~160 dataclasses as ``daemon.py`` loads:
# the cache of their code (``host/codecache.py``) is installed here, before that.  The
# ``dflashd`` command installs it in ``__main__``, after its Ctrl-C handler (this runs before
# it, so nothing here may take time); a plain import (a library, the tests) leaves it off.
if _sys.argv[:2] == ["-m", "--handover-fd"]:  # sys.argv while ``-m`` finds its module
    from dflashd.supervisor.host import codecache as _codecache

    _codecache.install()
