"""The gateway's subcommands: `serve`, `config check` (and `report`, from accounting)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click
import orjson

from accounting.mode import AccountingMode, accounting_mode
from core.errors import ConfigError
from gateway.config import GatewayConfig, load_config
from gateway.config_plain import normalised
from gateway.telemetry.config import check_packages
from wire.ports import taken_message

if TYPE_CHECKING:
    from accounting.supervisor import ApportionerChild
    from gateway.workers.peers import NodeWorker

PARENT_CHECK_S = 0.5  # how often a node's worker checks that its parent still runs


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
@click.option("--workers", default=None, type=click.IntRange(1, 1024),
              help="Worker processes serving the port (SO_REUSEPORT), with one accounting "
                   "child for them all. Default: the cores this process may use (its CPU "
                   "affinity, bounded by its cgroup's CPU quota).")
@click.option("--node-dir", hidden=True, default=None, type=click.Path(file_okay=False))
@click.option("--worker-index", hidden=True, default=0, type=int)
@click.option("--node-workers", hidden=True, default=1, type=int)
def serve(config_path: str, host: str | None, port: int | None, reuse_port: bool,
          log_level: str | None, workers: int | None, node_dir: str | None, worker_index: int,
          node_workers: int) -> None:
    """Run the gateway on uvloop: a lean HTTP/1.1 front for the completion routes, aiohttp for
    the rest. With accounting (`apportioner: process`, the default) it also runs the
    apportioner as a child process, restarted if it dies and stopped with the gateway. With
    --workers N > 1 a parent process runs N such gateways on the port and one accounting
    child for them (docs/operations.md). Exits 2 on a bad config before binding a port."""
    config = _load_or_exit(config_path)
    mode = accounting_mode(config.accounting, "serve")
    listen = dataclasses.replace(config.listen, host=host or config.listen.host,
                                 port=config.listen.port if port is None else port)
    config = dataclasses.replace(config, listen=listen)
    from gateway.workers.parent import default_workers

    count = default_workers() if workers is None else workers
    if node_dir is None and count > 1:
        _refuse_node(mode)
    from gateway.logs import configure

    configure(config.logging, log_level)
    import uvloop

    from gateway.workers.peers import NodeWorker

    if node_dir is None and count > 1:
        uvloop.run(_serve_node(config, mode, count, reuse_port=reuse_port,
                               config_path=config_path, log_level=log_level))
        return
    node = (NodeWorker(Path(node_dir), worker_index, node_workers) if node_dir is not None
            else None)
    uvloop.run(_serve(config, mode, reuse_port=reuse_port or node is not None,
                      config_path=config_path, log_level=log_level, node=node))


def _refuse_node(mode: AccountingMode) -> None:
    """What several workers cannot run, refused in one line (exit 2): accounting on the
    serving process's own loop (`inline`), which would give each worker a ledger writer and
    an apportioner of its own."""
    if mode.records_here:
        click.echo("wattgate: --workers: accounting.apportioner: inline records and apportions "
                   "in the serving process; several workers need `process` (or `external`), or "
                   "--workers 1", err=True)
        sys.exit(2)


async def _preflight(config: GatewayConfig, mode: AccountingMode, reuse_port: bool) -> None:
    """A taken port, then a ledger that cannot be opened, refused before anything starts."""
    if not reuse_port:
        taken = taken_message([(config.listen.host, config.listen.port)])
        if taken is not None:
            click.echo(f"Error: {taken}", err=True)
            sys.exit(1)
    if mode.enabled:
        await _ledger_or_exit(config)


async def _serve_node(config: GatewayConfig, mode: AccountingMode, workers: int, *,
                      reuse_port: bool, config_path: str, log_level: str | None) -> None:
    from accounting.node import NodeChild
    from gateway.workers.parent import (
        NodePlan,
        node_directory,
        remove_node_directory,
        reserve_port,
        run_node,
        worker_command,
    )

    await _preflight(config, mode, reuse_port)
    # port 0: one free port for all the workers, held by the parent till the node stops
    held = reserve_port(config.listen.host) if config.listen.port == 0 else None
    if held is not None:
        config = dataclasses.replace(config, listen=dataclasses.replace(
            config.listen, port=held.getsockname()[1]))
    node_dir = node_directory()
    try:
        child = (NodeChild(config_path, node_dir, log_level=log_level, mode=mode.child,
                           workers=workers)
                 if mode.child is not None else None)
        plan = NodePlan(workers, worker_command(config_path, config.listen.host,
                                                config.listen.port, log_level),
                        config.drain_timeout_s,
                        f"http://{config.listen.host}:{config.listen.port}")
        await run_node(plan, child, node_dir)
    finally:
        remove_node_directory(node_dir)
        if held is not None:
            held.close()


async def _serve(config: GatewayConfig, mode: AccountingMode, *, reuse_port: bool,
                 config_path: str, log_level: str | None = None,
                 node: NodeWorker | None = None) -> None:
    from accounting.ledger.base import LedgerError
    from gateway.app import build_app
    from gateway.front.server import start

    if node is None:  # a node's parent checked these before its workers started
        await _preflight(config, mode, reuse_port)
    child = await _accounting_child(config, mode, config_path, log_level, node)
    app = build_app(config, accounting=mode, apportioner=child,
                    node_store=node.rate_store() if node is not None else None)
    if node is not None:
        from gateway.workers.peers import serve_own_series

        serve_own_series(app, node)
    try:
        running = await start(config, app, reuse_port=reuse_port)
    except (OSError, LedgerError) as exc:
        reason = (f"cannot listen on {config.listen.host}:{config.listen.port}: {exc.strerror}"
                  if isinstance(exc, OSError) else f"ledger unavailable: {exc}")
        click.echo(f"wattgate: {reason}", err=True)
        if child is not None:
            await child.stop()
        sys.exit(1)
    where = f"http://{config.listen.host}:{running.port}"
    click.echo(f"wattgate listening on {where}" if node is None
               else f"wattgate worker {node.index} listening on {where}", err=True)
    # Everything built at start-up (config, app, imports) lives as long as the process: keep
    # it out of full collections, which otherwise walk it all and stall the loop.
    gc.collect()
    gc.freeze()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if node is not None:  # a worker whose parent is gone drains and stops
        watch = asyncio.create_task(_parent_gone(os.getppid(), stop))
    await stop.wait()
    if node is not None:
        watch.cancel()
    click.echo("wattgate: draining", err=True)
    await running.stop()
    if child is not None:
        await child.stop()


async def _parent_gone(parent_pid: int, stop: asyncio.Event) -> None:
    while os.getppid() == parent_pid:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), PARENT_CHECK_S)
        if stop.is_set():
            return
    click.echo(f"wattgate: the node's parent {parent_pid} is gone: draining", err=True)
    stop.set()


async def _accounting_child(config: GatewayConfig, mode: AccountingMode, config_path: str,
                            log_level: str | None, node: NodeWorker | None
                            ) -> ApportionerChild | None:
    """The accounting child this gateway records to (and apportions in, for `process`):
    started here, or a node worker's link to its node's child."""
    from accounting.node import WorkerLink
    from accounting.supervisor import TOKEN_ENV, ApportionerChild

    acct = config.accounting
    if mode.child is None:
        return None
    assert acct is not None
    spill = Path(acct.journal.directory(acct.ledger)) if acct.journal.enabled else None
    if node is not None:
        link = WorkerLink(node.directory, os.environ.pop(TOKEN_ENV, ""), mode=mode.child,
                          spill_dir=spill)
        await link.start()
        return link
    child = ApportionerChild(config_path, log_level=log_level, mode=mode.child,
                             spill_dir=spill)
    # Started, and its meters read, before requests are taken: on a new ledger the work
    # before an engine's first reading would get no share of its energy.
    await child.start()
    if not await child.wait_ready():
        click.echo("wattgate: the apportioner child is not ready yet (see its log); "
                   "serving anyway", err=True)
    return child


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
