"""The root `wattgate` group: every table entry resolves, and --help imports no subcommand."""

from __future__ import annotations

import subprocess
import sys

import click
from click.testing import CliRunner

import wattgate_cli


def test_every_command_in_the_table_resolves_to_a_click_command() -> None:
    ctx = click.Context(wattgate_cli.main)
    for name in wattgate_cli.COMMANDS:
        cmd = wattgate_cli.main.get_command(ctx, name)
        assert isinstance(cmd, click.Command), name
    assert wattgate_cli.main.get_command(ctx, "nope") is None


def test_help_lists_commands_without_importing_them() -> None:
    code = ("import sys, wattgate_cli; from click.testing import CliRunner; "
            "r = CliRunner().invoke(wattgate_cli.main, ['--help']); print(r.output); "
            "print('LOADED', sorted(m for m in sys.modules if m.split('.')[0] in "
            "('gateway', 'engines', 'loadgen')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    for name in wattgate_cli.COMMANDS:
        assert f"  {name} " in out
    assert out.strip().endswith("LOADED []")


def test_unknown_command_is_a_usage_error() -> None:
    result = CliRunner().invoke(wattgate_cli.main, ["frobnicate"])
    assert result.exit_code == 2 and "No such command" in result.output
