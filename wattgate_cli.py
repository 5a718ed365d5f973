"""The `wattgate` command: one click group whose subcommands live in each package's cli.py.

Subcommands are imported lazily from the table below so that `wattgate --help` stays fast
and no package has to import a package above it.
"""

from __future__ import annotations

import importlib
from typing import Any

import click

# name -> ("module:attribute" of a click command or group, one-line help for `wattgate --help`)
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("gateway.cli:serve", "Run the gateway (aiohttp on uvloop)."),
    "config": ("gateway.cli:config", "Validate a gateway config and print it normalised."),
    "apportioner": ("gateway.apportioner_cli:apportioner",
                    "Apportion metered energy to requests, as a process of its own."),
    "report": ("gateway.report_cli:report",
               "Chargeback from the ledger: energy, carbon, cost per tenant/model/precision."),
    "sim": ("engines.sim.cli:sim", "Run simulated vLLM / trtllm-serve engines (no GPU needed)."),
    "engines": ("engines.cli:engines", "Launch specs per precision for vLLM and TensorRT-LLM."),
    "agent": ("engines.meters.agent:agent", "Serve this node's GPU energy counters (NVML)."),
    "loadgen": ("loadgen.cli:loadgen", "Load generator: arrivals, traces, compare, sweep."),
    "demo": ("loadgen.cli:demo", "Simulated fleet + gateway + load: tables, bills, report."),
}


class LazyGroup(click.Group):
    """A click group that imports a subcommand's module only when that subcommand runs."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = COMMANDS.get(cmd_name)
        if entry is None:
            return None
        module_name, attr = entry[0].split(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            return None
        command: Any = getattr(module, attr, None)
        return command if isinstance(command, click.Command) else None

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # From the table: listing the commands imports none of them.
        with formatter.section("Commands"):
            formatter.write_dl([(name, COMMANDS[name][1]) for name in self.list_commands(ctx)])


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="wattgate")
def main() -> None:
    """wattgate: an LLM serving gateway that measures each request's energy, carbon and cost."""


if __name__ == "__main__":
    main()
