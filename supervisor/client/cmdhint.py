"""The pm2 habit: ``dflashd start train.py`` or ``dflashd start 'python train.py'`` (pure).

pm2 and friends run a script given by its name; dflashd runs a command.  A first word that is
no command on ``PATH`` but a file in the job's directory (``train.py``), or one word holding a
whole shell line (``'python train.py'``), would only end in ``spawn_failed``: a fatal home and
a page.  :func:`command_hint` finds those two slips before anything starts, so ``start`` says
what to type instead and launches nothing (exit 2).  A command that simply does not exist is
left to the spawn, which names it as before.
"""

from __future__ import annotations

import os
import shlex
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

# What runs a script by its suffix (the first word of the suggestion).
_RUNNERS: Final = {".py": "python", ".sh": "bash", ".bash": "bash"}


def _found(word: str, cwd: Path, path: str | None) -> bool:
    if "/" in word:
        return (cwd / word).exists()
    return shutil.which(word, path=path) is not None


def command_hint(command: Sequence[str], cwd: Path, env: Mapping[str, str]) -> str | None:
    """One line saying what was meant, or None when the command looks runnable (or is a
    plain unknown name, left to the spawn).  ``env``: the job's PATH wins over dflashd's."""
    if not command:
        return None
    first = command[0]
    path = env.get("PATH", os.environ.get("PATH"))
    target = cwd / first
    if "/" in first and target.is_file() and not os.access(target, os.X_OK):
        runner = _RUNNERS.get(target.suffix)  # ./train.py, not executable: what runs it
        rest = " ".join(shlex.quote(a) for a in command)
        if runner is not None:
            return f"{first!r} is not executable; did you mean `dflashd start -- {runner} {rest}`?"
        return f"{first!r} is not executable (chmod +x {shlex.quote(first)}, or name what runs it)"
    if _found(first, cwd, path):
        return None
    if len(command) == 1 and any(c.isspace() for c in first.strip()):
        try:
            words = shlex.split(first)
        except ValueError:
            return None
        if words and _found(words[0], cwd, path):
            shown = " ".join(shlex.quote(w) for w in words)
            return (
                f"{first!r} is one argument holding a whole command line; did you mean "
                f"`dflashd start -- {shown}` (its words apart)?"
            )
        return None
    script = cwd / first
    if "/" not in first and script.is_file():
        runner = _RUNNERS.get(script.suffix)
        rest = " ".join(shlex.quote(a) for a in command)
        if runner is not None:
            return (
                f"{first!r} is a file here, not a command; did you mean "
                f"`dflashd start -- {runner} {rest}`?"
            )
        return (
            f"{first!r} is a file here, not a command on PATH; did you mean "
            f"`dflashd start -- ./{rest}`?"
        )
    return None


def unlaunchable(command: Sequence[str], cwd: Path, env: Mapping[str, str]) -> str | None:
    """Why ``command`` cannot be spawned in ``cwd`` with ``env`` (its PATH), or None: what
    ``restart`` checks before it stops a run that is healthy."""
    if not command:
        return None
    first = command[0]
    if "/" in first:
        target = cwd / first
        if not target.is_file():
            return f"{first!r} does not exist (in {cwd})"
        return None if os.access(target, os.X_OK) else f"{first!r} is not executable"
    if shutil.which(first, path=env.get("PATH", "")) is None:
        return f"{first!r} is not a command on the job's PATH"
    return None
