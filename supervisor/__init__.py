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

import sys as _sys

__version__ = "0.5.0"

# The daemon program (``python -P -m dflashd.supervisor.daemon --handover-fd N …``, what
# ``start`` execs with its stop signals held) makes ~160 dataclasses as ``daemon.py`` loads:
# the cache of their code (``host/codecache.py``) is installed here, before that.  The
# ``dflashd`` command installs it in ``__main__``, after its Ctrl-C handler (this runs before
# it, so nothing here may take time); a plain import (a library, the tests) leaves it off.
if _sys.argv[:2] == ["-m", "--handover-fd"]:  # sys.argv while ``-m`` finds its module
    from dflashd.supervisor.host import codecache as _codecache

    _codecache.install()
