"""Running the gateway on one listening socket: the lean front first, aiohttp behind it.

    running = await start(config, app)      # binds; OSError if the port is taken
    ...
    await running.stop()                    # stop accepting, drain, close, app cleanup

The aiohttp runner is set up without a site of its own: its protocol factory only serves the
connections the front hands over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from aiohttp import web

from core.tasks import cancel_and_wait
from gateway.appkeys import CONNECTIONS, METRICS, PROXY
from gateway.config import GatewayConfig
from gateway.front.aiohttp_errors import (
    FIELD_MAX_BYTES,
    REQUEST_LINE_MAX_BYTES,
    safe_handler_factory,
)
from gateway.front.connections import FrontConnections
from gateway.front.fdbudget import max_connections, nofile_limit
from gateway.front.protocol import FrontProtocol
from gateway.front.settings import EdgeLimits, FrontSettings

log = logging.getLogger("wattgate.front")
COMPLETION_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
SWEEP_S = 1.0  # how late past a deadline (head, body, keep-alive) a connection may close
LINGER_S = 1.0


class RunningGateway:
    def __init__(self, config: GatewayConfig, runner: web.AppRunner, server: asyncio.Server,
                 connections: FrontConnections):
        self.config = config
        self.runner = runner
        self.server = server
        self.connections = connections
        sockets = server.sockets or ()
        self.port: int = sockets[0].getsockname()[1] if sockets else config.listen.port
        self._sweeper = asyncio.create_task(self._sweep(), name="wattgate-keepalive")

    async def _sweep(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(SWEEP_S)
            self.connections.expire(loop.time())

    async def stop(self) -> None:
        """Stop accepting, answer new requests 503 while in-flight ones finish (bounded by
        `drain_timeout_s`), then close every connection and run the app's cleanup."""
        await cancel_and_wait(self._sweeper)
        self.server.close()
        proxy = self.runner.app[PROXY]
        proxy.draining = True
        self.connections.closing = True
        self.connections.close_idle()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.config.drain_timeout_s):
                await proxy.idle.wait()
                await proxy.answers_sent()  # the last writes held for their records
        self.connections.abort_all()
        await self.runner.cleanup()


async def start(config: GatewayConfig, app: web.Application, *, reuse_port: bool = False,
                cancel_on_disconnect: bool = True) -> RunningGateway:
    """Set up `app` and listen on config.listen (port 0: any free port)."""
    listen = config.listen
    runner = web.AppRunner(app, handle_signals=False, access_log=None,
                           shutdown_timeout=config.drain_timeout_s,
                           handler_cancellation=cancel_on_disconnect,
                           keepalive_timeout=listen.keepalive_s,
                           # after an early answer (408, 413) aiohttp reads what the client
                           # still sends, so it can read the answer; not for 10 s
                           lingering_time=LINGER_S, max_line_size=REQUEST_LINE_MAX_BYTES,
                           max_field_size=FIELD_MAX_BYTES)
    await runner.setup()
    aiohttp_server = runner.server
    assert aiohttp_server is not None
    rejected = app[METRICS].client_errors

    def on_reject(reason: str) -> None:
        rejected.labels(reason).inc()

    nofile = nofile_limit()
    cap, warning = max_connections(listen.max_connections, nofile, listen.max_inflight,
                                   len(config.endpoints()))
    if warning is not None:
        log.warning("%s", warning)
    log.info("taking at most %d client connections (file-descriptor limit %d)", cap, nofile)
    limits = EdgeLimits(header_timeout_s=listen.header_timeout_s,
                        body_timeout_s=listen.body_timeout_s,
                        body_min_bytes_per_s=listen.body_min_bytes_per_s,
                        keepalive_s=listen.keepalive_s, max_connections=cap)
    proxy = app[PROXY]
    settings = FrontSettings(serve=proxy.serve,
                             after_records=proxy.after_records,
                             handoff=safe_handler_factory(aiohttp_server, on_reject),
                             routes=COMPLETION_ROUTES, max_body_bytes=config.max_body_bytes,
                             cancel_on_disconnect=cancel_on_disconnect, limits=limits,
                             on_reject=on_reject)
    connections = app[CONNECTIONS]
    loop = asyncio.get_running_loop()
    try:
        server = await loop.create_server(lambda: FrontProtocol(settings, connections),
                                          config.listen.host, config.listen.port, backlog=2048,
                                          reuse_port=reuse_port or None)
    except OSError:
        await runner.cleanup()
        raise
    return RunningGateway(config, runner, server, connections)
