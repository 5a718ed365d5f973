"""One accounting child for the workers of a node (`wattgate serve --workers N`).

`NodeChild`, in the node's parent process: starts the child with `--records-socket`, a Unix
socket in the node's runtime directory that every worker connects to (intake.py), and
supervises it as `ApportionerChild` does (restart with back-off, liveness probes). A
successor starts from the last watermark its predecessor reported on `/healthz`
(`--open-floor`): nothing a worker still holds for it arrived earlier.

`WorkerLink`, in each worker: its `RecordLink` (eager: a record is on the socket when its
response has been written) connected to the node's child, reconnected with back-off after
the child died or was restarted (the link sends what was not acknowledged again; meanwhile
records go to the worker's spill journal). It reads the child's `/metrics` and
`/energy-check` through the port file the child writes in the runtime directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from pathlib import Path

import aiohttp
import orjson

from accounting.link import RecordLink
from accounting.mode import AccountingMode
from accounting.supervisor import (
    FETCH_TIMEOUT_S,
    PROBE_EVERY_S,
    SPILL_RETRY_S,
    TOKEN_ENV,
    ApportionerChild,
    _log_death,
)
from core.tasks import cancel_and_wait

log = logging.getLogger("wattgate.apportioner")

RECORDS_SOCKET = "records.sock"  # in the node's runtime directory
PORT_FILE = "child.port"
RESTARTS_FILE = "child.restarts"  # how often the parent restarted the child, for /metrics
CONNECT_FIRST_S = 0.05  # a worker retries its connection after this, doubling
CONNECT_MAX_S = 1.0  # up to this


class NodeChild(ApportionerChild):
    """The parent's accounting child, listening for the node's workers."""

    def __init__(self, config_path: str, node_dir: Path, *, log_level: str | None,
                 mode: AccountingMode, workers: int):
        super().__init__(config_path, log_level=log_level, mode=mode)
        self.workers = workers
        self.node_dir = node_dir
        self.socket_path = node_dir / RECORDS_SOCKET
        self._floor: float | None = None  # the last watermark the child reported

    @property
    def token(self) -> str:
        """The bearer token the workers read the child's series with."""
        return self._token

    def _heard(self, body: bytes) -> None:
        with contextlib.suppress(orjson.JSONDecodeError, TypeError, AttributeError):
            since = orjson.loads(body).get("watermark_s")
            if isinstance(since, float | int):
                self._floor = float(since)

    def argv(self, records_fd: int | None = None) -> list[str]:
        floor = time.time() if self._floor is None else min(self._floor, time.time())
        return [*super().argv(), "--records-socket", str(self.socket_path),
                "--replica", self.replica, "--idle-class", "--open-floor", repr(floor),
                "--expect-links", str(self.workers),
                *self.mode.child_flags()]

    async def start(self) -> None:
        self._stopping = False
        self.port_file = self.node_dir / PORT_FILE
        await self._launch("accounting")

    async def _spawn(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.port_file.unlink()
        if self.proc is not None:  # a successor: the workers count it on their /metrics
            restarts = self.node_dir / RESTARTS_FILE
            restarts.with_suffix(".tmp").write_text(str(self.restarts + 1))
            restarts.with_suffix(".tmp").replace(restarts)
        # its own process group, as ApportionerChild's; it exits when the parent is gone
        self.proc = await asyncio.create_subprocess_exec(
            *self.argv(), stdin=asyncio.subprocess.DEVNULL, preexec_fn=os.setpgrp,
            env={**os.environ, TOKEN_ENV: self._token})
        self._port = None
        self._spawned_at = time.monotonic()
        self._answering = True
        log.info("accounting child of the node started, pid %d", self.proc.pid)


class WorkerLink(ApportionerChild):
    """A worker's link to the node's accounting child (it starts no process)."""

    def __init__(self, node_dir: Path, token: str, *, mode: AccountingMode,
                 spill_dir: Path | None):
        super().__init__("", mode=mode, spill_dir=spill_dir)
        self._token = token
        self.node_dir = node_dir
        self.port_file = node_dir / PORT_FILE
        self.link = RecordLink(eager=True)
        # the node's replica name, as the parent's NodeChild records under
        self.replica = f"{socket.gethostname()}:{os.getppid()}"
        self._connect: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._stopping = False
        if self._spill_dir is not None and self._spill is None:
            self._spill = await self.link.open_spill(self._spill_dir, SPILL_RETRY_S)
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=FETCH_TIMEOUT_S),
            headers={"Authorization": f"Bearer {self._token}"})
        await self._try_connect()
        self._connect = asyncio.create_task(self._keep_connected(), name="wattgate-node-link")
        self._connect.add_done_callback(_log_death)

    async def _try_connect(self) -> bool:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            await asyncio.get_running_loop().sock_connect(sock, str(self.node_dir /
                                                                    RECORDS_SOCKET))
        except OSError:
            sock.close()
            self._went_down()
            return False
        self.link.attach(sock)
        self._count_restarts()
        self._port = None  # a new child: its port is read again
        self._answering = True
        self._down_since = None
        if self._up is not None:
            self._up.set(1.0)
        return True

    def _count_restarts(self) -> None:
        """The parent's count of the child's restarts, on this worker's counter (merged over
        the workers by its maximum: gateway/workers/merge.py)."""
        try:
            restarts = int((self.node_dir / RESTARTS_FILE).read_text())
        except (OSError, ValueError):
            return
        if restarts > self.restarts and self._restarts_metric is not None:
            self._restarts_metric.inc(restarts - self.restarts)
        self.restarts = max(self.restarts, restarts)

    async def _keep_connected(self) -> None:
        backoff, probed = CONNECT_FIRST_S, time.monotonic()
        while not self._stopping:
            if self.link.attached:
                backoff = CONNECT_FIRST_S
                # woken when the link lets go of the child's socket or a probe is due, not
                # polled: an idle worker's wake-ups are CPU its node spends for nothing
                await self.link.detached(probed + PROBE_EVERY_S - time.monotonic())
                if time.monotonic() - probed >= PROBE_EVERY_S:
                    probed = time.monotonic()
                    await self._probe_once()  # answered: reads wait for the child again
                continue
            if not await self._try_connect():
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2.0, CONNECT_MAX_S)

    async def stop(self, deadline_s: float = 0.0) -> None:
        """Let go of the child (it is the parent's to stop): what it has not acknowledged
        goes to the spill journal."""
        self._stopping = True
        await cancel_and_wait(self._connect)
        self._connect = None
        await self._let_go()
