"""What ``dflashd restart`` repeats: the last ``start``'s config path, command and directory.

``invocation.json`` in the home, written by the daemon that won the home's lock (a refused
start records nothing), read by ``restart``.  It holds no secrets: the config's path, not its
contents.
"""

from __future__ import annotations

import os
from pathlib import Path

from dflashd.supervisor.home import Home


def has_run(home: Home) -> bool:
    """A job was started in this home at least once (a typo'd ``--home`` has not)."""
    return (home.root / "invocation.json").is_file() or home.state_file.is_file()


def save_invocation(home: Home, config_path: Path | None, command: tuple[str, ...]) -> None:
    """What ``dflashd restart`` repeats: the config file and the command (no secrets)."""
    from dflashd.supervisor.speak.statusview import write_state

    data = {
        "config": str(config_path.absolute()) if config_path else None,
        "command": list(command),
        "cwd": os.getcwd(),  # what `restart` runs in, wherever it is typed
    }
    try:
        write_state(home.root / "invocation.json", data)
    except OSError:
        pass


def load_invocation_cwd(home: Home) -> Path | None:
    """The directory the last ``start`` ran in."""
    from dflashd.supervisor.speak.statusview import read_state

    cwd = (read_state(home.root / "invocation.json") or {}).get("cwd")
    return Path(cwd) if isinstance(cwd, str) and cwd else None


def load_invocation(home: Home) -> tuple[Path | None, tuple[str, ...]]:
    """The last ``start``'s config path and command."""
    from dflashd.supervisor.speak.statusview import read_state

    data = read_state(home.root / "invocation.json") or {}
    config = data.get("config")
    command = data.get("command")
    return (
        Path(config) if isinstance(config, str) else None,
        tuple(str(c) for c in command) if isinstance(command, list) else (),
    )
