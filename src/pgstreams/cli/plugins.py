"""Commands that applications add to ``pgstreams``: the ``pgstreams.commands`` entry point group.

An application declares an entry point in the group, in its ``pyproject.toml``::

    [project.entry-points."pgstreams.commands"]
    myapp = "myapp.cli:add_commands"

The entry point names a callable that receives the root :class:`typer.Typer` application of ``pgstreams``
and adds its commands to it (``app.command("name")(function)`` or ``app.add_typer(sub_app, name=...)``).
:func:`load_commands` calls every one of them once, before the command line is parsed, so they should
import little (the command's own work imports the rest when it runs). An entry point that cannot be
loaded, or whose callable raises, leaves the other commands working; ``pgstreams`` reports it in one line
when an unknown command is used (the one it would have added).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

import typer
from typer.core import TyperGroup

from .common import CliError, one_line

#: The entry point group whose callables add commands to ``pgstreams``.
COMMANDS_GROUP = "pgstreams.commands"


@dataclass(frozen=True)
class PluginFailure:
    """An entry point of :data:`COMMANDS_GROUP` that could not add its commands: its ``name``, its
    ``target`` (``module:function``) and the ``error`` (one line)."""

    name: str
    target: str
    error: str

    def __str__(self) -> str:
        return f"the commands of {self.name!r} ({self.target}) could not be loaded: {self.error}"


_failures: list[PluginFailure] = []
_loaded: weakref.WeakSet[typer.Typer] = weakref.WeakSet()


def load_commands(app: typer.Typer) -> list[PluginFailure]:
    """Call every entry point of :data:`COMMANDS_GROUP` with ``app`` (once per application) and return
    those that failed, without raising: an application's broken install must not break the others."""
    if app in _loaded:
        return list(_failures)
    _loaded.add(app)
    for ep in entry_points(group=COMMANDS_GROUP):
        try:
            ep.load()(app)
        except Exception as exc:  # noqa: BLE001 - whatever the application raised is reported, not raised
            failure = PluginFailure(ep.name, ep.value, one_line(f"{type(exc).__name__}: {exc}"))
            if failure not in _failures:
                _failures.append(failure)
    return list(_failures)


class RootGroup(TyperGroup):
    """The root command group of ``pgstreams``: an unknown command, while some application's commands
    could not be loaded, is reported with the reason (exit 1) rather than as a typing error."""

    # click's Context and Command types: typed loosely, as typer's internal copy of click provides them
    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        """The command ``cmd_name``; raises :class:`CliError` when it is unknown and an application's
        commands failed to load."""
        command = super().get_command(ctx, cmd_name)
        if command is None and _failures:
            raise CliError(f"No such command {cmd_name!r}; " + "; ".join(map(str, _failures)))
        return command
