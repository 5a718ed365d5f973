"""`wattgate report`: the chargeback report from the ledger (SQLite or PostgreSQL)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import click
import yaml

from accounting.config import LedgerConfig, parse_accounting, paths_base
from accounting.ledger.base import Ledger, LedgerError
from accounting.ledger.budget_store import BudgetStore
from accounting.report import GROUP_KEYS, Report, build_report, render
from accounting.timeparse import parse_time
from core.errors import ConfigError


def _config_document(config: Path) -> dict[str, Any]:
    """The gateway config file as parsed YAML (a mapping; anything else reads as empty)."""
    try:
        raw: Any = yaml.safe_load(config.read_text()) or {}
    except OSError as exc:
        raise click.ClickException(f"cannot read {config}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise click.ClickException(f"{config}: {exc}") from None
    return raw if isinstance(raw, dict) else {}


def _where(config: Path | None, sqlite: Path | None, dsn: str | None) -> LedgerConfig:
    """The ledger a report reads: --sqlite, --dsn, or the config file's (resolved)."""
    if sqlite is not None:
        if not sqlite.is_file():
            raise click.ClickException(f"no ledger at {sqlite}")
        return LedgerConfig("sqlite", str(sqlite))
    if dsn:
        return LedgerConfig("postgres", dsn=dsn)
    if config is None:
        raise click.UsageError("give --config, --sqlite or --dsn")
    raw = _config_document(config)
    try:
        cfg = parse_accounting(raw.get("accounting"), os.environ,
                               base_dir=paths_base(raw, config.parent))
    except ConfigError as exc:
        raise click.ClickException(exc.message) from None
    ledger_cfg = cfg.ledger
    if ledger_cfg.kind == "sqlite":
        path = Path(ledger_cfg.path)
        path = path if path.is_absolute() else config.parent / path
        # Opening a missing file would create an empty ledger and print an empty bill.
        if not path.is_file():
            raise click.ClickException(f"no ledger at {path} (accounting.ledger of {config}): "
                                       "has a gateway run with this config?")
        return LedgerConfig("sqlite", str(path))
    return LedgerConfig("postgres", dsn=ledger_cfg.dsn)


def _ledger(config: Path | None, sqlite: Path | None, dsn: str | None) -> Ledger:
    # Only the store: reading a report needs nothing of the accounting service.
    from accounting.metering import make_ledger

    return make_ledger(_where(config, sqlite, dsn))


def _budget_store(config: Path | None, sqlite: Path | None, dsn: str | None) -> BudgetStore:
    from accounting.metering import make_budget_store

    return make_budget_store(_where(config, sqlite, dsn))


async def _report(ledger: Ledger, since: float, until: float, tenant: str | None,
                  group_by: list[str]) -> Report:
    await ledger.open()
    try:
        data = await ledger.usage(since, until, tenant, group_by=group_by)
    finally:
        await ledger.close()
    return build_report(data, group_by, since, until)


def _budgets(config: Path | None, sqlite: Path | None, dsn: str | None, tenant: str | None,
             fmt: str) -> str:
    from gateway.tenancy.report import budgets_of, render, standing

    if config is None:
        raise click.UsageError("--budgets needs --config (the tenants' budgets are there)")
    try:
        found = budgets_of(_config_document(config))
    except ConfigError as exc:
        raise click.ClickException(exc.message) from None
    if tenant:
        found = {k: v for k, v in found.items() if k == tenant}
    ledger = _budget_store(config, sqlite, dsn)

    async def read() -> str:
        await ledger.open()
        try:
            return render(await standing(ledger, found), fmt)
        finally:
            await ledger.close()

    try:
        return asyncio.run(read())
    except LedgerError as exc:
        raise click.ClickException(exc.message) from None


@click.command("report")
@click.option("--config", "config", type=click.Path(dir_okay=False, path_type=Path),
              help="gateway YAML; its accounting.ledger is read")
@click.option("--sqlite", type=click.Path(dir_okay=False, path_type=Path),
              help="read this SQLite ledger file instead")
@click.option("--dsn", envvar="WATTGATE_LEDGER_DSN", help="read this PostgreSQL ledger instead")
@click.option("--since", default="-24h", show_default=True,
              help="Unix seconds, ISO 8601, or relative (-2h)")
@click.option("--until", default=None, help="default: now")
@click.option("--tenant", default=None)
@click.option("--group-by", "group_by", default="tenant", show_default=True,
              help=f"comma-separated: {', '.join(GROUP_KEYS)}")
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table",
              show_default=True)
@click.option("--budgets", is_flag=True,
              help="spend against budget per tenant and period instead (needs --config)")
def report(config: Path | None, sqlite: Path | None, dsn: str | None, since: str,
           until: str | None, tenant: str | None, group_by: str, fmt: str,
           budgets: bool) -> None:
    """Energy (J, kWh), carbon (g), cost (USD), tokens, requests, goodput, J/token and idle
    share per group; idle accounts are shown as separate rows. With --budgets: each
    tenant's spend in the current UTC period (charged + held) against its budgets."""
    if budgets:
        click.echo(_budgets(config, sqlite, dsn, tenant, fmt), nl=False)
        return
    now = time.time()
    try:
        until_s = parse_time(until, now) if until else now
        since_s = parse_time(since, now)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    if until_s <= since_s:
        raise click.BadParameter("--until must be after --since")
    groups = [g.strip() for g in group_by.split(",") if g.strip()]
    bad = [g for g in groups if g not in GROUP_KEYS]
    if bad:
        raise click.BadParameter(f"{bad[0]!r} is not one of {', '.join(GROUP_KEYS)}",
                                 param_hint="--group-by")
    ledger = _ledger(config, sqlite, dsn)
    try:
        result = asyncio.run(_report(ledger, since_s, until_s, tenant, groups))
    except LedgerError as exc:
        raise click.ClickException(exc.message) from None
    click.echo(render(result, fmt), nl=False)
