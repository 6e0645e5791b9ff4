"""What ``dflashd restart`` repeats: the last ``start``'s config path, command, directory and
environment.

``invocation.json`` in the home, written by the daemon that won the home's lock (a refused
start records nothing), read by ``restart``.  It holds no secrets: the config's path, not its
contents.  ``environment.json`` beside it holds the start's environment, as pm2 keeps it:
0600 in an owner-only home, read back only by ``restart`` and never printed (secrets live
there; ``status``, ``tail`` and the report show the keys of the job's environment at most).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Final

from dflashd.supervisor.host.home import Home


def has_run(home: Home) -> bool:
    """A job was started in this home at least once (a typo'd ``--home`` has not)."""
    return (home.root / "invocation.json").is_file() or home.state_file.is_file()


ENVIRONMENT: Final = "environment.json"


def save_invocation(home: Home, config_path: Path | None, command: tuple[str, ...]) -> None:
    """What ``dflashd restart`` repeats: the config file and the command (no secrets), and,
    apart, this process's environment (the start's: the daemon inherits it whole)."""
    from dflashd.supervisor.speak.statusview import write_state

    data = {
        "config": str(config_path.absolute()) if config_path else None,
        "command": list(command),
        "cwd": os.getcwd(),  # what `restart` runs in, wherever it is typed
    }
    try:
        write_state(home.root / "invocation.json", data)
        write_state(home.root / ENVIRONMENT, {"environ": dict(os.environ)})  # 0600
    except OSError:
        pass


def load_environment(home: Home) -> dict[str, str] | None:
    """The last start's environment, or None when it was not recorded (a home of an older
    dflashd) or cannot be read whole: ``restart`` then says it uses the caller's."""
    from dflashd.supervisor.speak.statusview import read_state

    data = read_state(home.root / ENVIRONMENT)
    environ = data.get("environ") if data is not None else None
    if not isinstance(environ, dict) or not environ:
        return None
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in environ.items()):
        return None
    if any(not k or "=" in k or "\0" in k or "\0" in v for k, v in environ.items()):
        return None
    return dict(environ)


class InvocationUnreadable(Exception):
    """The record of the last start cannot be trusted: its message says which file and why."""


def load_invocation(home: Home) -> tuple[Path | None, tuple[str, ...], Path | None]:
    """The last ``start``'s config path, command and directory, exactly as recorded.

    An empty command is the bundled trainer only when the record says so (``"command": []``):
    a file that is missing, damaged, or holds the wrong types raises
    :class:`InvocationUnreadable`, never "no command" (that would launch a job nobody asked for).
    """
    path = home.root / "invocation.json"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise InvocationUnreadable(f"{path} is missing") from None
    except OSError as exc:
        raise InvocationUnreadable(f"{path}: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "rb") as fh:
            raw = fh.read(_MAX_BYTES + 1)
    except OSError as exc:
        raise InvocationUnreadable(f"{path}: {exc.strerror}") from None
    try:
        data = json.loads(raw) if len(raw) <= _MAX_BYTES else None
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise InvocationUnreadable(f"{path} is damaged (not a JSON object)")
    config, command, cwd = data.get("config"), data.get("command"), data.get("cwd")
    if not isinstance(command, list) or not all(isinstance(c, str) for c in command):
        raise InvocationUnreadable(f"{path} is damaged (its command is not a list of strings)")
    if config is not None and not (isinstance(config, str) and config):
        raise InvocationUnreadable(f"{path} is damaged (its config is not a path)")
    if cwd is not None and not (isinstance(cwd, str) and cwd):
        raise InvocationUnreadable(f"{path} is damaged (its cwd is not a path)")
    return (
        Path(config) if config else None,
        tuple(command),
        Path(cwd) if cwd else None,
    )


_MAX_BYTES = 1 << 20
