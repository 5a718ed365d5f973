"""The gateway's subcommands: `serve`, `config check` (and `report`, from accounting)."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import signal
import sys
from pathlib import Path

import click
import orjson

from accounting.mode import AccountingMode, accounting_mode
from core.errors import ConfigError
from gateway.config import GatewayConfig, load_config
from gateway.config_plain import normalised
from gateway.telemetry.config import check_packages
from wire.ports import taken_message


def _load_or_exit(path: str) -> GatewayConfig:
    try:
        config = load_config(path)
        check_packages(config.telemetry)  # export on needs the `otel` extra: said before start
        return config
    except ConfigError as exc:
        click.echo(f"wattgate: invalid config: {exc.message}", err=True)
        sys.exit(2)


@click.command()
@click.option("--config", "config_path", required=True, type=click.Path(dir_okay=False),
              help="Gateway YAML config (see deploy/examples/local.yaml).")
@click.option("--host", default=None, help="Listen address (overrides listen.host).")
@click.option("--port", default=None, type=int, help="Listen port (overrides listen.port).")
@click.option("--reuse-port", is_flag=True, help="SO_REUSEPORT: several processes share a port.")
@click.option("--log-level", default=None, type=click.Choice(["debug", "info", "warning", "error"]),
              help="Overrides logging.level of the config.")
def serve(config_path: str, host: str | None, port: int | None, reuse_port: bool,
          log_level: str | None) -> None:
    """Run the gateway on uvloop: a lean HTTP/1.1 front for the completion routes, aiohttp for
    the rest. With accounting (`apportioner: process`, the default) it also runs the
    apportioner as a child process, restarted if it dies and stopped with the gateway.
    Exits 2 on a bad config before binding a port."""
    config = _load_or_exit(config_path)
    mode = accounting_mode(config.accounting, "serve")
    listen = dataclasses.replace(config.listen, host=host or config.listen.host,
                                 port=config.listen.port if port is None else port)
    config = dataclasses.replace(config, listen=listen)
    from gateway.logs import configure

    configure(config.logging, log_level)
    import uvloop

    uvloop.run(_serve(config, mode, reuse_port=reuse_port, config_path=config_path,
                      log_level=log_level))


async def _serve(config: GatewayConfig, mode: AccountingMode, *, reuse_port: bool,
                 config_path: str, log_level: str | None = None) -> None:
    from accounting.ledger.base import LedgerError
    from accounting.supervisor import ApportionerChild
    from gateway.app import build_app
    from gateway.front.server import start

    if not reuse_port:  # a taken port is refused before the ledger and the child
        taken = taken_message([(config.listen.host, config.listen.port)])
        if taken is not None:
            click.echo(f"Error: {taken}", err=True)
            sys.exit(1)
    acct = config.accounting
    if mode.enabled:
        await _ledger_or_exit(config)
    child = None
    if mode.child is not None:  # the accounting child records (and apportions, for `process`)
        assert acct is not None
        child = ApportionerChild(config_path, log_level=log_level, mode=mode.child,
                                 spill_dir=Path(acct.journal.directory(acct.ledger))
                                 if acct.journal.enabled else None)
        # Started, and its meters read, before requests are taken: on a new ledger the work
        # before an engine's first reading would get no share of its energy.
        await child.start()
        if not await child.wait_ready():
            click.echo("wattgate: the apportioner child is not ready yet (see its log); "
                       "serving anyway", err=True)
    app = build_app(config, accounting=mode, apportioner=child)
    try:
        running = await start(config, app, reuse_port=reuse_port)
    except (OSError, LedgerError) as exc:
        reason = (f"cannot listen on {config.listen.host}:{config.listen.port}: {exc.strerror}"
                  if isinstance(exc, OSError) else f"ledger unavailable: {exc}")
        click.echo(f"wattgate: {reason}", err=True)
        if child is not None:
            await child.stop()
        sys.exit(1)
    click.echo(f"wattgate listening on http://{config.listen.host}:{running.port}", err=True)
    # Everything built at start-up (config, app, imports) lives as long as the process: keep
    # it out of full collections, which otherwise walk it all and stall the loop.
    gc.collect()
    gc.freeze()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    click.echo("wattgate: draining", err=True)
    await running.stop()
    if child is not None:
        await child.stop()


async def _ledger_or_exit(config: GatewayConfig) -> None:
    """Open and close the ledger once before anything starts: a ledger that cannot be opened
    (a bad path, a refused database) ends the process with one line, before the apportioner
    child is started and before a port is bound."""
    from accounting.ledger.base import LedgerError
    from accounting.metering import make_ledger

    assert config.accounting is not None
    ledger = make_ledger(config.accounting.ledger)
    try:
        await ledger.open()
    except LedgerError as exc:
        click.echo(f"wattgate: ledger unavailable: {exc}", err=True)
        sys.exit(1)
    finally:
        await ledger.close()


@click.group()
def config() -> None:
    """Inspect gateway configs."""


@config.command("check")
@click.argument("path", type=click.Path(dir_okay=False))
def config_check(path: str) -> None:
    """Validate PATH and print the normalised config as JSON (secrets hidden)."""
    cfg = _load_or_exit(path)
    click.echo(orjson.dumps(normalised(cfg), option=orjson.OPT_INDENT_2).decode())
    click.echo(f"{Path(path)}: ok ({len(cfg.models)} models, "
               f"{sum(len(m.endpoints) for m in cfg.models)} endpoints, "
               f"{len(cfg.tenants)} tenants)", err=True)
