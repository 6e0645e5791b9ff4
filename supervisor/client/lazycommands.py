"""A command group whose commands of other modules are loaded only when named.

``dflashd start`` is the command whose start-up counts (a foreground start execs the daemon
program, and the log benchmark counts both programs' CPU): it should not load ``tail``'s log
readers or ``stacks``' renderers first.  A command named on the command line is imported then;
``--help``, shell completion and a word that is no command (click suggests the nearest) load
all of them.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping

import click


class LazyCommands(click.Group):
    """A ``click.Group`` with ``lazy_commands``: command name -> ``"module:attribute"``."""

    lazy_commands: Mapping[str, str] = {}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy_commands})

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        if args and self.get_command(ctx, args[0]) is None:  # a word that is no command:
            for name in self.lazy_commands:  # every command loaded, for click's suggestions
                self.get_command(ctx, name)
        return super().resolve_command(ctx, args)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        where = self.lazy_commands.get(cmd_name)
        if cmd_name not in self.commands and where is not None:
            module, attribute = where.split(":")
            command = getattr(importlib.import_module(module), attribute)
            if not isinstance(command, click.Command):
                raise TypeError(f"{where} is not a command")
            self.add_command(command, name=cmd_name)
        return super().get_command(ctx, cmd_name)
