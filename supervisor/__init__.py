"""dflashd.supervisor: the daemon, its decisions and the ``dflashd`` command line.

The daemon's loop and its state sit here (``daemon``, ``core``, ``runs``, ...); its rooms
are grouped by concern: :mod:`~dflashd.supervisor.decide` (pure decisions),
:mod:`~dflashd.supervisor.host` (processes, custody, signals, cgroups, /proc),
:mod:`~dflashd.supervisor.watch` (output, progress, GPUs, torchrun, stacks) and
:mod:`~dflashd.supervisor.speak` (records, alerts, metrics, status, the control socket).

0.3 kept every module side by side (``dflashd.supervisor.ending``): those names still import,
as the same module objects, for code outside this repository; nothing here uses them.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
from types import ModuleType
from typing import Any

__version__ = "0.1.0"

# module -> the room it moved into (0.4)
MOVED_MODULES = {
    **dict.fromkeys(
        ("ending", "policy", "incidents", "hang", "goodput", "effects", "verdicts"), "decide"
    ),
    **dict.fromkeys(
        (
            "groups",
            "spawn",
            "custody",
            "proof",
            "cgroups",
            "procfs",
            "processops",
            "caches",
            "fdreserve",
            "pyspy",
            "recovery",
        ),
        "host",
    ),
    **dict.fromkeys(
        (
            "linewatch",
            "formats",
            "progress",
            "elastic",
            "observe",
            "gpuwatch",
            "nvml",
            "notify",
            "stacks",
            "stackdumps",
        ),
        "watch",
    ),
    **dict.fromkeys(
        (
            "reporter",
            "recorder",
            "alerts",
            "metrics",
            "httpserve",
            "history",
            "diagnostics",
            "daemonlog",
            "control",
            "doors",
            "snapshot",
            "statusview",
            "echo",
        ),
        "speak",
    ),
}


class _MovedModule:
    """Loads an old name as the module that now holds it (the same object); a loader by
    protocol, not by ``importlib.abc`` (whose import costs every command 20 ms)."""

    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(self.target)

    def exec_module(self, module: ModuleType) -> None:
        return None


class _MovedModules:
    """``dflashd.supervisor.<old name>`` -> ``dflashd.supervisor.<room>.<name>``."""

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        package, _, name = fullname.rpartition(".")
        room = MOVED_MODULES.get(name) if package == __name__ else None
        if room is None:
            return None
        loader: Any = _MovedModule(f"{__name__}.{room}.{name}")  # a Loader by its methods
        return importlib.machinery.ModuleSpec(fullname, loader)


if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
    sys.meta_path.append(_MovedModules())
