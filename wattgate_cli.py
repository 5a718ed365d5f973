"""The `wattgate` command: one click group whose subcommands live in each package's cli.py.

Subcommands are imported lazily from the table below so that `wattgate --help` stays fast
and no package has to import a package above it.
"""

from __future__ import annotations

import importlib
from typing import Any

import click

# name -> "module:attribute" of a click command or group
COMMANDS: dict[str, str] = {
    "serve": "gateway.cli:serve",
    "config": "gateway.cli:config",
    "report": "gateway.accounting.report_cli:report",
    "sim": "engines.sim.cli:sim",
    "engines": "engines.cli:engines",
    "agent": "engines.meters.agent:agent",
    "loadgen": "loadgen.cli:loadgen",
    "demo": "loadgen.cli:demo",
}


class LazyGroup(click.Group):
    """A click group that imports a subcommand's module only when that subcommand runs."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            return None
        command: Any = getattr(module, attr, None)
        return command if isinstance(command, click.Command) else None


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="wattgate")
def main() -> None:
    """wattgate: an LLM serving gateway that measures each request's energy, carbon and cost."""


if __name__ == "__main__":
    main()
