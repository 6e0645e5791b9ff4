"""What ``dflashd restart`` runs: the last start replayed (its command, config, directory and
environment), or what the caller says instead, checked whole before anything is stopped."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import click

from dflashd.supervisor.client.cmdhint import unlaunchable
from dflashd.supervisor.client.common import fail
from dflashd.supervisor.host.config import Config
from dflashd.supervisor.host.home import Home
from dflashd.supervisor.model.exitcodes import EXIT_USAGE
from dflashd.supervisor.speak.invocation import (
    InvocationUnreadable,
    load_environment,
    load_invocation,
)


@dataclass(frozen=True, slots=True)
class Replay:
    """A restart's start: the config path, the command, and the environment for the daemon
    and its job (None: this shell's)."""

    config_path: Path | None
    command: tuple[str, ...]
    env: dict[str, str] | None

    def check(self, config: Config) -> None:
        """One line and exit 2 when the job's command cannot be spawned with the environment
        it would get (this shell's or the start's, the config's ``env`` over it): called
        before anything is stopped."""
        job_env = {**(self.env if self.env is not None else os.environ), **config.env}
        if (why := unlaunchable(config.command, Path(config.cwd), job_env)) is None:
            return
        which = "this shell's" if self.env is None else "the last start's"
        hint = "" if self.env is None else " (--env-from-shell runs it with this shell's)"
        fail(
            f"cannot restart: {why} with {which} environment; nothing was stopped{hint}", EXIT_USAGE
        )


def replay(
    where: Home, command: tuple[str, ...], config_path: Path | None, *, env_from_shell: bool
) -> Replay:
    """What ``restart`` starts, or one line and exit 2 (nothing stopped, nothing started)
    when the record cannot be read and no command is given.  The directory is changed to the
    start's: the config is then prepared (``start.prepare``) and checked (:meth:`Replay.check`)."""
    try:
        last_config, last_command, started_in = load_invocation(where)
    except InvocationUnreadable as exc:
        if not command:  # never a guess: an unreadable record is not "the bundled trainer"
            fail(
                f"{exc}: cannot tell what the last start ran, so nothing is restarted; "
                "say it: dflashd restart -- COMMAND (or dflashd start)",
                EXIT_USAGE,
            )
        last_config, last_command, started_in = None, (), None  # told here what to run
    if not command and started_in is not None and started_in.is_dir():
        os.chdir(started_in)  # relative paths in the command and the config mean what they did
    command = command or last_command
    config_path = config_path or last_config
    env = None if env_from_shell else load_environment(where)
    if env is None and not env_from_shell:
        click.echo(
            "dflashd: no record of the last start's environment: using this shell's", err=True
        )
    return Replay(config_path, command, env)
