"""`wattgate apportioner --config X`: the apportioner as a process of its own
(accounting/process.py). This command reads the gateway's config; the accounting package gets
its accounting section, the endpoints and the metrics keys' check as plain values."""

from __future__ import annotations

import os
import sys
from functools import partial
from pathlib import Path

import click

from accounting.config import CHILD_NICE
from accounting.mode import AccountingMode, accounting_mode
from accounting.service import EngineInfo
from core.errors import ConfigError
from gateway.config import GatewayConfig, load_config
from gateway.telemetry.config import check_packages
from gateway.telemetry.wiring import energy_export


def engine_infos(config: GatewayConfig) -> list[EngineInfo]:
    """The endpoints of the config, as accounting knows them."""
    return [EngineInfo(name=ep.name, model=model, precision=ep.precision, gpus=ep.gpus,
                       kind=ep.kind)
            for model, ep in config.endpoints()]


def _load_or_exit(path: str, *, records_fd: bool, record_only: bool
                  ) -> tuple[GatewayConfig, AccountingMode]:
    """The config, and the accounting mode its section and the flags give this process."""
    try:
        config = load_config(path)
        check_packages(config.telemetry)  # its energy export needs the `otel` extra
    except ConfigError as exc:
        click.echo(f"wattgate: invalid config: {exc.message}", err=True)
        sys.exit(2)
    try:
        mode = accounting_mode(config.accounting, "apportioner", records_fd=records_fd,
                               record_only=record_only)
    except ConfigError as exc:
        what = "invalid config: " if exc.path == "accounting" else ""
        click.echo(f"wattgate: {what}{exc.message}", err=True)
        sys.exit(2)
    return config, mode


@click.command()
@click.option("--config", "config_path", required=True, type=click.Path(dir_okay=False),
              help="The gateways' YAML config (its accounting section and endpoints).")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Listen address of /metrics, /energy-check and /healthz (0.0.0.0 for a "
                   "scraper on another host, e.g. its own Kubernetes pod; set a metrics key).")
@click.option("--port", default=9464, show_default=True, type=int,
              help="Listen port of /metrics (0: any free port; see --port-file).")
@click.option("--port-file", default=None, type=click.Path(dir_okay=False),
              help="Write the bound port here once listening.")
@click.option("--parent-pid", default=None, type=int,
              help="Exit when this process is no longer the parent (set by `wattgate serve`).")
@click.option("--log-level", default=None, type=click.Choice(["debug", "info", "warning", "error"]),
              help="Overrides logging.level of the config.")
@click.option("--nice", "niceness", default=0, show_default=True, type=click.IntRange(0, 19),
              help="Add this to the process's nice value: on a core it shares with a gateway, "
                   "the gateway's requests go first (`wattgate serve` starts its child with "
                   f"{CHILD_NICE}).")
@click.option("--records-fd", default=None, type=int,
              help="Read a gateway's finished requests from this socket and record them to "
                   "the ledger for it (set by `wattgate serve`).")
@click.option("--records-socket", default=None, type=click.Path(dir_okay=False),
              help="Listen on this Unix socket for the finished requests of a node's workers "
                   "and record them (set by `wattgate serve --workers N`).")
@click.option("--expect-links", default=1, type=click.IntRange(1),
              help="With --records-socket: the workers whose first frames end the "
                   "--open-floor (set by `wattgate serve --workers N`).")
@click.option("--idle-class", is_flag=True,
              help="Run in the idle scheduling class while keeping up with --records-fd, in "
                   "the normal class at --nice when behind (set by `wattgate serve`).")
@click.option("--record-only", is_flag=True,
              help="Only record the --records-fd requests; apportion elsewhere (set by "
                   "`wattgate serve` with `accounting.apportioner: external`).")
@click.option("--open-floor", default=None, type=float,
              help="The gateway's oldest open or unwritten request (wall-clock s): its "
                   "watermark until its first frame (set by `wattgate serve`).")
@click.option("--replica", default=None,
              help="The replica name those requests are recorded under (the gateway's).")
def apportioner(config_path: str, host: str, port: int, port_file: str | None,
                parent_pid: int | None, log_level: str | None, niceness: int,
                records_fd: int | None, idle_class: bool, record_only: bool,
                open_floor: float | None, replica: str | None,
                records_socket: str | None, expect_links: int) -> None:
    """Poll the engines' meters and apportion their energy to the ledger's requests, in this
    process; leader-elected through the ledger, so several may run and one apportions. Started
    by `wattgate serve`, it also records that gateway's requests (--records-fd).
    Exits 2 on a bad config, 1 when the ledger cannot be opened or the port bound."""
    linked = records_fd is not None or records_socket is not None
    config, mode = _load_or_exit(config_path, records_fd=linked,
                                 record_only=record_only)
    if niceness:
        os.nice(niceness)
    from gateway.logs import configure

    configure(config.logging, log_level)
    import uvloop

    from accounting.ledger.base import LedgerError
    from accounting.process import run_apportioner
    from gateway.auth import Authenticator

    assert config.accounting is not None  # the mode says accounting is on
    try:
        uvloop.run(run_apportioner(config.accounting, engine_infos(config), Authenticator(config),
                                   mode, host=host, port=port,
                                   port_file=Path(port_file) if port_file else None,
                                   parent_pid=parent_pid, records_fd=records_fd,
                                   replica=replica, idle_class=idle_class,
                                   open_floor=open_floor,
                                   records_socket=Path(records_socket) if records_socket
                                   else None, expect_links=expect_links,
                                   export=partial(energy_export, config.telemetry)))
    except LedgerError as exc:
        click.echo(f"wattgate apportioner: ledger unavailable: {exc.message}", err=True)
        sys.exit(1)
    except OSError as exc:
        click.echo(f"wattgate apportioner: cannot listen on {host}:{port}: {exc.strerror}",
                   err=True)
        sys.exit(1)
