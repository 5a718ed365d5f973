"""The node's rate-limit store: one token bucket per (tenant, limit) in the parent's memory,
served to the node's workers over a Unix socket, so a tenant's limits hold for the whole
node however the kernel spreads its connections over the workers.

The workers use it as they use the PostgreSQL store of several replicas (gateway/tenancy/
shared.py, `BucketStore`): each holds leases and admits from them locally, topping them up
in one exchange for all its tenants; the arithmetic is lease.py's `exchange`, on the parent's
clock. Where `tenant_controls.shared_store` is configured, the workers use that store
directly instead (the limits then hold across nodes too).

Wire: one JSON line per request and per answer, in order, on each worker's connection.
`{"op": "exchange", "asks": [[tenant, limit, capacity, period_s, amount], ...]}` ->
`{"grants": [[tenant, limit, granted, level], ...]}`; `{"op": "heartbeat", "replica": R}` ->
`{"live": N}` (the workers heard from in the last REPLICA_LIVE_S); `{"op": "forget", ...}` ->
`{}`. While the parent does not answer, a worker takes the store for down
(`on_store_down: open`: limit / N on its own buckets).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson

from gateway.tenancy.lease import Exchange, exchange
from gateway.tenancy.rate_store import Ask, RateStoreError

log = logging.getLogger("wattgate.workers")

RATES_SOCKET = "rates.sock"
REPLICA_LIVE_S = 10.0  # a worker not heard from for this long holds no share
TIMEOUT_S = 0.5  # a worker takes the parent for down past this
MAX_LINE = 16 << 20


class NodeBuckets:
    """The buckets and the live workers (the parent's state; plain arithmetic)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.buckets: dict[tuple[str, str], tuple[float, float]] = {}  # level, at_s
        self.seen: dict[str, float] = {}

    def exchange(self, asks: Sequence[Sequence[Any]]) -> list[list[Any]]:
        now = self.clock()
        out: list[list[Any]] = []
        for tenant, limit, capacity, period_s, amount in asks:
            key = (str(tenant), str(limit))
            level, at_s = self.buckets.get(key, (float(capacity), now))
            got = exchange(level, at_s, now, float(capacity), float(period_s), float(amount))
            self.buckets[key] = (got.level, max(at_s, now))
            out.append([key[0], key[1], got.granted, got.level])
        return out

    def heartbeat(self, replica: str) -> int:
        now = self.seen[replica] = self.clock()
        self.seen = {r: t for r, t in self.seen.items() if now - t < REPLICA_LIVE_S}
        return len(self.seen)

    def answer(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        if op == "exchange":
            return {"grants": self.exchange(request["asks"])}
        if op == "heartbeat":
            return {"live": self.heartbeat(str(request["replica"]))}
        if op == "forget":
            self.seen.pop(str(request["replica"]), None)
            return {}
        return {"error": f"unknown op {op!r}"}


async def serve_buckets(buckets: NodeBuckets, path: Path) -> asyncio.AbstractServer:
    """Serve `buckets` on the Unix socket `path` until the server is closed."""

    async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError, ValueError):
            while line := await reader.readline():
                try:
                    answer = buckets.answer(orjson.loads(line))
                except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                    answer = {"error": str(exc)}
                writer.write(orjson.dumps(answer) + b"\n")
        writer.close()

    return await asyncio.start_unix_server(one, str(path), limit=MAX_LINE)


class NodeRateStore:
    """A worker's `BucketStore`: the parent's buckets over its socket."""

    def __init__(self, path: Path, timeout_s: float = TIMEOUT_S):
        self.path = path
        self.timeout_s = timeout_s
        self._streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self._lock = asyncio.Lock()  # one request at a time on the connection

    async def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        async with self._lock:
            try:
                async with asyncio.timeout(self.timeout_s):
                    if self._streams is None:
                        self._streams = await asyncio.open_unix_connection(
                            str(self.path), limit=MAX_LINE)
                    reader, writer = self._streams
                    writer.write(orjson.dumps(request) + b"\n")
                    line = await reader.readline()
                if not line:
                    raise ConnectionResetError("the node's parent closed the rate store")
                answer: dict[str, Any] = orjson.loads(line)
            except (OSError, TimeoutError, ValueError) as exc:
                self._drop()
                raise RateStoreError(f"node rate store: {exc or type(exc).__name__}") from exc
        if "error" in answer:
            raise RateStoreError(f"node rate store: {answer['error']}")
        return answer

    def _drop(self) -> None:
        if self._streams is not None:
            self._streams[1].close()
            self._streams = None

    async def exchange(self, asks: Sequence[Ask]) -> dict[tuple[str, str], Exchange]:
        got = await self._ask({"op": "exchange", "asks": [
            [a.tenant, a.limit, a.capacity, a.period_s, a.amount] for a in asks]})
        return {(t, lim): Exchange(float(granted), float(level))
                for t, lim, granted, level in got["grants"]}

    async def heartbeat(self, replica: str) -> int:
        return int((await self._ask({"op": "heartbeat", "replica": replica}))["live"])

    async def forget(self, replica: str) -> None:
        await self._ask({"op": "forget", "replica": replica})

    async def close(self) -> None:
        self._drop()
