"""The warm standby's host side (issue 51): which jobs can have one, the interpreter started
for the next run, and whether it may be used when that run is launched.

The standby is ``trainer/standby.py`` run by path under the job's own Python with the next
run's exact cwd and environment (the daemon never imports torch): it imports what the job
will, writes a manifest and waits.  At the relaunch the launcher uses it only when nothing
differs (:func:`unusable_because`); otherwise it is ended and the launch is cold, and the
``spawn`` record says why.  Only ``python [flags] script.py ...`` and ``python [flags] -m
module ...`` qualify: under torchrun the workers are torchrun's own children.
"""

from __future__ import annotations

import json
import os
import re
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from dflashd.supervisor.host.proof import SpawnedChild

STANDBY_SCRIPT: Final = Path(__file__).parents[2] / "trainer" / "standby.py"
_PYTHON: Final = re.compile(r"^python(?:[0-9]+(?:\.[0-9]+)?)?$")
_FLAGS: Final = frozenset({"-u", "-O", "-OO", "-B", "-s", "-E", "-I", "-q"})
_FLAGS_WITH_VALUE: Final = frozenset({"-X", "-W"})
_SITE_PACKAGE: Final = re.compile(r"/(?:site|dist)-packages/([A-Za-z_][A-Za-z0-9_]*)/")
MAX_LEARNT: Final = 32
GO_SIGNAL: Final = signal.SIGUSR1  # trainer/standby.py waits for it


@dataclass(frozen=True, slots=True)
class PythonJob:
    """A command that runs a Python script or module under a plain interpreter."""

    python: str
    flags: tuple[str, ...]
    mode: str  # "script" or "module"
    target: str
    args: tuple[str, ...]


def python_job(argv: tuple[str, ...]) -> PythonJob | None:
    """``python [flags] script.py ...`` or ``python [flags] -m module ...``, else None."""
    if not argv or _PYTHON.match(Path(argv[0]).name) is None:
        return None
    flags: list[str] = []
    i = 1
    while i < len(argv):
        word = argv[i]
        if word in _FLAGS:
            flags.append(word)
        elif word in _FLAGS_WITH_VALUE and i + 1 < len(argv):
            flags += [word, argv[i + 1]]
            i += 1
        elif word == "-m" and i + 1 < len(argv):
            return PythonJob(argv[0], tuple(flags), "module", argv[i + 1], argv[i + 2 :])
        elif word.endswith(".py") and not word.startswith("-"):
            return PythonJob(argv[0], tuple(flags), "script", word, argv[i + 1 :])
        else:
            return None  # -c, stdin, an option this does not know: never guessed
        i += 1
    return None


def standby_argv(job: PythonJob, manifest: Path, imports: list[str]) -> tuple[str, ...]:
    """The standby's command line: the job's interpreter and flags, then the standby script."""
    head = (job.python, *job.flags, str(STANDBY_SCRIPT), str(manifest), ",".join(imports))
    return (*head, job.mode, job.target, *job.args)


def learnt_imports(pid: int) -> list[str]:
    """The packages a live run of the job loaded compiled code from (``/proc/PID/maps``):
    the heavy imports the standby does ahead of the next run."""
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as fh:
            text = fh.read(8 << 20)
    except OSError:
        return []
    found = dict.fromkeys(m.group(1) for m in _SITE_PACKAGE.finditer(text))
    return [n for n in found if not n.startswith("_") and n != "nvidia"][:MAX_LEARNT]


@dataclass
class Standby:
    """The next run's interpreter, started: its process, and what it was started with."""

    run_no: int
    launched: SpawnedChild
    argv: tuple[str, ...]  # the job's command it stands in for
    cwd: Path
    env: dict[str, str]
    manifest: Path

    @property
    def pid(self) -> int:
        """Its process id."""
        return self.launched.pid

    def alive(self) -> bool:
        """It has not exited (a reaped or lost child counts as exited)."""
        process = self.launched.process
        return process is not None and process.poll() is None

    def read_manifest(self) -> dict[str, Any] | None:
        """What it wrote once its imports were done (None: not yet, or unreadable)."""
        try:
            found = json.loads(self.manifest.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return found if isinstance(found, dict) else None

    def rss_mib(self) -> float | None:
        """Its resident memory now."""
        try:
            with open(f"/proc/{self.pid}/statm", encoding="ascii") as fh:
                pages = int(fh.read().split()[1])
        except (OSError, ValueError, IndexError):
            return None
        return round(pages * os.sysconf("SC_PAGE_SIZE") / (1 << 20), 1)

    def view(self) -> dict[str, Any]:
        """``status``'s ``standby`` object."""
        found = self.read_manifest() or {}
        ready = bool(found.get("ready")) and self.alive()
        imported = found.get("imported") if isinstance(found.get("imported"), list) else []
        return {
            "pid": self.pid,
            "for_run": self.run_no,
            "ready": ready,
            "why": found.get("why") if found else "importing",
            "rss_mib": self.rss_mib(),
            "imported": imported,
        }


def unusable_because(
    standby: Standby, argv: tuple[str, ...], cwd: Path, env: Mapping[str, str]
) -> str | None:
    """Why the standby may not become this launch (None: it may): anything differs from a
    cold launch, it died, its imports are not done, or a file it imported changed since."""
    if tuple(argv) != standby.argv:
        return "the command changed"
    if cwd != standby.cwd:
        return "the working directory changed"
    if dict(env) != standby.env:
        changed = sorted(k for k in set(env) | set(standby.env) if env.get(k) != standby.env.get(k))
        return f"the environment changed ({', '.join(changed[:5])})"
    if not standby.alive():
        return "the standby died"
    found = standby.read_manifest()
    if found is None:
        return "the standby's imports were not done yet"
    if not found.get("ready"):
        return f"the standby is not usable: {found.get('why')}"
    files = found.get("files")
    for path, seen in files.items() if isinstance(files, dict) else ():
        try:
            st = os.stat(path)
        except OSError:
            return f"{path} is gone since the standby imported it"
        if [st.st_mtime_ns, st.st_size] != seen:
            return f"{path} changed on disk since the standby imported it"
    return None
