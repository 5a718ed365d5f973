"""A worker's view of its node: its own series served on a Unix socket in the node's runtime
directory, and the node's `/metrics` gathered from every worker's socket (merge.py).

Whichever worker a scrape lands on answers for the node: its own exposition and its peers',
each asked with a deadline (a worker that does not answer in PEER_TIMEOUT_S, killed or
restarting, is left out and its `wattgate_worker_up` is 0), merged into one.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from aiohttp import web

from gateway.appkeys import METRICS
from gateway.workers.merge import merge
from gateway.workers.rates import RATES_SOCKET, NodeRateStore

PEER_TIMEOUT_S = 1.0


@dataclass(frozen=True, slots=True)
class NodeWorker:
    """This process is worker `index` of `workers`, the node's runtime files in `directory`."""

    directory: Path
    index: int
    workers: int

    def socket(self, index: int) -> Path:
        return self.directory / f"worker-{index}.sock"

    def rate_store(self) -> NodeRateStore:
        """The node's rate store, served by the parent (rates.py)."""
        return NodeRateStore(self.directory / RATES_SOCKET)


NODE = web.AppKey("node", NodeWorker)


async def _own(request: web.Request) -> web.Response:
    return web.Response(body=request.app[METRICS].render())


def serve_own_series(app: web.Application, node: NodeWorker) -> None:
    """While `app` runs, its series are served on the worker's socket for its peers."""
    app[NODE] = node

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        inner = web.Application()
        inner[METRICS] = app[METRICS]
        inner.router.add_get("/metrics", _own)
        runner = web.AppRunner(inner, access_log=None)
        await runner.setup()
        path = node.socket(node.index)
        path.unlink(missing_ok=True)
        await web.UnixSite(runner, str(path)).start()
        yield
        await runner.cleanup()
        path.unlink(missing_ok=True)

    app.cleanup_ctx.append(ctx)


async def _peer(node: NodeWorker, index: int) -> bytes | None:
    with contextlib.suppress(aiohttp.ClientError, TimeoutError, OSError):
        async with aiohttp.ClientSession(
                connector=aiohttp.UnixConnector(path=str(node.socket(index))),
                timeout=aiohttp.ClientTimeout(total=PEER_TIMEOUT_S)) as session, \
                session.get("http://worker/metrics") as resp:
            if resp.status == 200:
                return await resp.read()
    return None


async def node_series(app: web.Application) -> bytes:
    """The series of every worker of the node, merged."""
    node = app[NODE]
    own = app[METRICS].render()
    others = await asyncio.gather(*(_peer(node, i) for i in range(node.workers)
                                    if i != node.index))
    texts = list(others)
    texts.insert(node.index, own)
    return merge(texts)
