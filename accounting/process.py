"""The apportioner process (`wattgate apportioner --config X`): the meter poller and the
apportioner on an event loop of their own, leader-elected through the ledger as in a gateway,
with a small HTTP server for Prometheus (`/metrics`: the tenant and engine energy, carbon and
cost counters, residuals, the energy check's gauges) and `/energy-check` (JSON). Both need
the config's metrics key (or its admin key) when one is set, as the gateway's /metrics does;
`/healthz` (liveness) is open. A supervising gateway, which holds only the keys' digests,
hands its child a token of its own in WATTGATE_APPORTIONER_TOKEN, accepted too.

`wattgate serve` runs it as a child (supervisor.py; `--parent-pid` makes it exit when the
gateway is gone, even killed) and appends its `/metrics` to its own; on Kubernetes it runs as
its own Deployment (`accounting.apportioner: external` on the gateways).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import os
import signal
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from accounting.config import AccountingConfig
from accounting.intake import RecordIntake
from accounting.metrics import ApportionerMetrics
from accounting.mode import AccountingMode
from accounting.priority import Background
from accounting.recorder import child_gc
from accounting.service import AccountingService, EngineInfo
from accounting.supervisor import TOKEN_ENV
from core.errors import error_body

log = logging.getLogger("wattgate.apportioner")

PARENT_CHECK_S = 0.5  # how often a child checks that its gateway is still there
DRAIN_S = 5.0  # a child whose gateway is gone reads its socket to the end for at most this
SERVICE = web.AppKey("service", AccountingService)
REGISTRY = web.AppKey("registry", CollectorRegistry)
AUTH: web.AppKey[ScrapeCheck] = web.AppKey("auth")
TOKEN = web.AppKey("token", str)  # "" : none
INTAKE = web.AppKey("intake", RecordIntake)  # where this child records a gateway's requests


class ScrapeCheck(Protocol):
    """Who may read /metrics and /energy-check: the gateway's keys answer it (an
    `Authenticator` of gateway/auth.py, built by `wattgate apportioner` from the config), so
    the child holds the keys' digests only through this."""

    def may_scrape(self, header: str | None) -> bool: ...


class Export(Protocol):
    """An export of the apportioner's counters running beside Prometheus (the OpenTelemetry
    one of gateway/telemetry/energy.py), stopped when the process stops."""

    def shutdown(self) -> None: ...


# the apportioner's counters (None: this process does not apportion) -> the export started, if any
ExportHook = Callable[[ApportionerMetrics | None], Export | None]


def _may_read(request: web.Request) -> bool:
    """The metrics (or admin) key where the config sets one, or the supervising gateway's
    token."""
    header = request.headers.get("Authorization")
    token = request.app[TOKEN]
    if token and header is not None:
        digest = hashlib.sha256(header.encode()).digest()
        if hmac.compare_digest(digest, hashlib.sha256(f"Bearer {token}".encode()).digest()):
            return True
    return request.app[AUTH].may_scrape(header)


def _unauthorized(what: str) -> web.Response:
    return web.Response(status=401, content_type="application/json", body=error_body(
        f"{what} needs the metrics API key", "authentication_error", "invalid_metrics_key"))


async def _metrics(request: web.Request) -> web.Response:
    if not _may_read(request):
        return _unauthorized("/metrics")
    body = generate_latest(request.app[REGISTRY])
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _energy_check(request: web.Request) -> web.Response:
    if not _may_read(request):
        return _unauthorized("/energy-check")
    return web.Response(body=orjson.dumps(request.app[SERVICE].energy_check()),
                        content_type="application/json")


async def _healthz(request: web.Request) -> web.Response:
    """Alive (the loop answers). A ledger that refuses all work is reported, not failed: a
    restart would not mend it and, on SQLite, would open a fresh file at the path."""
    service = request.app[SERVICE]
    fault: str | None = getattr(service.ledger, "fault", None)
    intake = request.app.get(INTAKE)
    # the floor a successor must start from (intake.py `watermark`), for a node's parent
    watermark = intake.watermark() if intake is not None else None
    return web.Response(body=orjson.dumps({"status": "ok", "leader": service.is_apportioner,
                                           "pid": os.getpid(), "ledger_fault": fault,
                                           "watermark_s": watermark}),
                        content_type="application/json")


def apportioner_app(service: AccountingService, registry: CollectorRegistry,
                    auth: ScrapeCheck, token: str = "") -> web.Application:
    app = web.Application()
    app[SERVICE] = service
    app[REGISTRY] = registry
    app[AUTH] = auth
    app[TOKEN] = token
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/energy-check", _energy_check)
    app.router.add_get("/healthz", _healthz)
    return app


def _write_port(path: Path, port: int) -> None:
    """Atomically: a reader sees the whole port or no file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(str(port))
    tmp.replace(path)


async def run_apportioner(accounting: AccountingConfig, engines: list[EngineInfo],
                          auth: ScrapeCheck, mode: AccountingMode, *, host: str, port: int,
                          port_file: Path | None = None, parent_pid: int | None = None,
                          records_fd: int | None = None, replica: str | None = None,
                          idle_class: bool = False, open_floor: float | None = None,
                          export: ExportHook | None = None,
                          records_socket: Path | None = None, expect_links: int = 1) -> None:
    """Run the roles of `mode` (mode.py, launched as `wattgate apportioner`) until
    SIGTERM/SIGINT (or, with `parent_pid`, until that process is gone); then store the
    counters and release the lock. Where it records, the requests come from a gateway on the
    socket `records_fd` (link.py) and are recorded under `replica`; with `idle_class`, in the
    idle scheduling class while it keeps up with them (priority.py). `open_floor`: the
    gateway's oldest open or unwritten request when it started this child (link.py,
    `RecordLink.floor`). `records_socket`: instead of `records_fd`, a Unix socket the workers
    of a node (`wattgate serve --workers N`) connect to, each on a connection of its own.
    `accounting`, `engines` and `auth` are what `wattgate apportioner`
    (gateway/apportioner_cli.py) read from the gateway's config: this package does not read
    that file."""
    linked = records_fd is not None or records_socket is not None
    assert linked == mode.records_here, mode
    registry = CollectorRegistry()
    service = AccountingService(
        accounting, engines, registry=registry, mode=mode,
        replica=(replica or f"{socket.gethostname()}:{os.getppid()}") if linked
        else f"{socket.gethostname()}:{os.getpid()}:apportioner")
    intake: RecordIntake | None = None
    if linked:
        assert service.recorder is not None
        # Before the service starts: a journal replay's write publishes this gateway's
        # watermark, which must already be the gateway's floor, not "nothing open"
        intake = RecordIntake(service.recorder, Background(
            idle_class, behind_s=accounting.behind_s), floor=open_floor, expect=expect_links)
    await service.start()
    if intake is not None and records_fd is not None:
        await intake.start(records_fd)
    elif intake is not None and records_socket is not None:
        await intake.listen(records_socket)
    # Ready (the port file written) once the meters were read: work a gateway records from
    # then on falls in metered intervals (work before an engine's first reading gets no share).
    await service.first_step()
    child_gc()
    # the OTLP export of the counters where the config turns it on (the hook of gateway/telemetry)
    energy = export(service.apportioner_metrics) if export is not None else None
    app = apportioner_app(service, registry, auth,
                          os.environ.pop(TOKEN_ENV, ""))  # popped: nothing it starts inherits it
    if intake is not None:
        app[INTAKE] = intake
    runner = web.AppRunner(app, access_log=None)
    try:
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = int(runner.addresses[0][1])  # the port bound (--port 0: any free one)
        log.info("apportioner pid %d serving /metrics on %s:%d", os.getpid(), host, bound)
        if port_file is not None:
            _write_port(port_file, bound)
        await _until_stopped(parent_pid, intake)
    finally:
        await runner.cleanup()
        await service.stop()
        if energy is not None:
            await asyncio.to_thread(energy.shutdown)


async def _until_stopped(parent_pid: int | None, intake: RecordIntake | None) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), PARENT_CHECK_S)
        if intake is not None and intake.closed.is_set():
            # The gateway closed its end (or sent what could not be read): the gateway's
            # supervisor starts a new child on a new socket if the gateway still runs
            log.warning("the gateway's record socket is closed: the child stops")
            return
        if parent_pid is not None and os.getppid() != parent_pid:
            log.warning("gateway process %d is gone: the apportioner stops", parent_pid)
            if intake is not None:
                # What the gateway sent before it went is still in the socket: read it all
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(intake.closed.wait(), DRAIN_S)
            return
