"""The parent of a node's workers (`wattgate serve --workers N`): it serves no HTTP.

It starts the node's one accounting child (accounting/node.py), then N workers, each
`wattgate serve --workers 1` bound to the same port with SO_REUSEPORT (the kernel spreads
new connections over them) and linked to the child. A worker that dies is started again
after a back-off (BACKOFF_FIRST_S, doubling to BACKOFF_MAX_S; back to the first after a
worker lived HEALTHY_RUN_S). SIGTERM or SIGINT is passed on to the workers, which drain; the
child is stopped last, once every worker has handed it its records.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import click

from accounting.node import NodeChild
from accounting.supervisor import TOKEN_ENV
from core.tasks import cancel_and_wait
from gateway.workers.rates import RATES_SOCKET, NodeBuckets, serve_buckets

log = logging.getLogger("wattgate.workers")

BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 30.0
HEALTHY_RUN_S = 60.0
STOP_MARGIN_S = 10.0  # past the drain deadline, a worker still running is killed


@dataclass(frozen=True, slots=True)
class NodePlan:
    """What the parent starts: `workers` of `worker_argv` (the serve flags they share)."""

    workers: int
    worker_argv: Sequence[str]
    drain_s: float
    url: str  # where the workers listen


class Worker:
    """One worker process, restarted when it dies until the node stops."""

    def __init__(self, index: int, argv: list[str], env: dict[str, str]):
        self.index = index
        self.argv = argv
        self.env = env
        self.proc: asyncio.subprocess.Process | None = None
        self.restarts = 0
        self.stopping = False

    async def _spawn(self) -> None:
        # A process group of its own: the parent decides the order things stop in
        self.proc = await asyncio.create_subprocess_exec(
            *self.argv, stdin=asyncio.subprocess.DEVNULL, preexec_fn=os.setpgrp, env=self.env)
        log.info("worker %d started, pid %d", self.index, self.proc.pid)

    async def run(self) -> None:
        backoff = BACKOFF_FIRST_S
        while not self.stopping:
            try:
                await self._spawn()
            except OSError as exc:
                log.error("could not start worker %d (%s): retrying in %.1f s",
                          self.index, exc, backoff)
            else:
                assert self.proc is not None
                started = time.monotonic()
                rc = await self.proc.wait()
                if self.stopping:
                    return
                if time.monotonic() - started >= HEALTHY_RUN_S:
                    backoff = BACKOFF_FIRST_S
                log.error("worker %d (pid %d) exited with %s; restarting in %.1f s",
                          self.index, self.proc.pid, rc, backoff)
                self.restarts += 1
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2.0, BACKOFF_MAX_S)

    def signal(self, sig: int) -> None:
        proc = self.proc
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)


async def run_node(plan: NodePlan, child: NodeChild | None, node_dir: Path) -> None:
    """Run the node until SIGTERM/SIGINT: child first, workers, then stop in reverse."""
    stop = asyncio.Event()  # a signal while the child starts stops the node as well
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    env = dict(os.environ)
    # the tenants' rate limits for the whole node (rates.py), before any worker asks
    rates = await serve_buckets(NodeBuckets(), node_dir / RATES_SOCKET)
    if child is not None:
        await child.start()
        if not await child.wait_ready():
            click.echo("wattgate: the accounting child is not ready yet (see its log); "
                       "serving anyway", err=True)
        env[TOKEN_ENV] = child.token
    workers = [Worker(i, [*plan.worker_argv, "--node-dir", str(node_dir), "--worker-index",
                          str(i), "--node-workers", str(plan.workers)], env)
               for i in range(plan.workers)]
    tasks = [asyncio.create_task(w.run(), name=f"wattgate-worker-{w.index}") for w in workers
             if not stop.is_set()]
    click.echo(f"wattgate: {plan.workers} workers starting on {plan.url} (parent pid "
               f"{os.getpid()})", err=True)
    await stop.wait()
    click.echo("wattgate: draining the workers", err=True)
    for w in workers:
        w.stopping = True
        w.signal(signal.SIGTERM)
    await _reap(workers, plan.drain_s + STOP_MARGIN_S)
    for task in tasks:
        await cancel_and_wait(task)
    rates.close()
    if child is not None:
        await child.stop()


async def _reap(workers: list[Worker], deadline_s: float) -> None:
    procs = [w.proc for w in workers if w.proc is not None]
    waits = [asyncio.create_task(p.wait()) for p in procs]
    if not waits:
        return
    _done, pending = await asyncio.wait(waits, timeout=deadline_s)
    if pending:
        for w in workers:
            w.signal(signal.SIGKILL)
        await asyncio.wait(pending)


CPU_MAX = Path("/sys/fs/cgroup/cpu.max")  # cgroup v2: "QUOTA PERIOD" or "max PERIOD"


def default_workers(cpu_max: Path = CPU_MAX) -> int:
    """The cores this process may use: its CPU affinity, bounded by its cgroup's CPU quota
    where one is set (a container limited to 2 CPUs on a 64-core host gets 2 workers, not 64)."""
    cores = len(os.sched_getaffinity(0))
    try:
        quota, period = cpu_max.read_text().split()[:2]
    except (OSError, ValueError):
        return cores
    if quota == "max":
        return cores
    with contextlib.suppress(ValueError, ZeroDivisionError):
        return max(1, min(cores, math.ceil(int(quota) / int(period))))
    return cores


def node_directory() -> Path:
    """The node's runtime files: the child's socket and port file, the workers' sockets
    (short: a Unix socket path holds at most 107 bytes)."""
    return Path(tempfile.mkdtemp(prefix="wattgate-node-"))


def remove_node_directory(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def worker_command(config_path: str, host: str, port: int, log_level: str | None) -> list[str]:
    argv = [sys.executable, "-m", "wattgate_cli", "serve", "--config", config_path,
            "--workers", "1", "--reuse-port", "--host", host, "--port", str(port)]
    return argv + (["--log-level", log_level] if log_level else [])


def reserve_port(host: str) -> socket.socket:
    """A free port on `host` for the workers, bound with SO_REUSEPORT and not listening: the
    workers bind it too, and it stays the node's while this socket is open."""
    family, kind, proto, _name, addr = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(addr)
    return sock
