"""Join every request sent to the gateway's bill (GET /admin/v1/requests/{id}, once final)
and to the simulator's truth (GET /sim/requests/{id} on the engine that served it; the
gateway sends its request id upstream as x-request-id): its Shapley view, against which the
bill is judged, and its residency view, reported beside. Conservation is read from the
ledger: per engine, shares + idle account against the metered energy of its intervals."""

from __future__ import annotations

import asyncio
import math
import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from loadgen.truth.client import Sent
from loadgen.truth.fleet import ADMIN_KEY


@dataclass(frozen=True, slots=True)
class Joined:
    sent: Sent
    engine: str
    status: str  # the gateway's outcome
    final: bool
    bill_j: float
    truth_j: float  # the simulator's Shapley truth (the reference the bill follows)
    prompt_tokens: int  # as billed
    completion_tokens: int  # as billed
    truth_completion_tokens: int
    residency_j: float = 0.0  # the simulator's residency view, reported beside
    truth_stderr_j: float = 0.0  # standard error of truth_j (0 where exact)

    @property
    def error(self) -> float:
        """Signed relative error of the bill (bill - truth) / truth; nan without truth."""
        return (self.bill_j - self.truth_j) / self.truth_j if self.truth_j > 0 else math.nan

    @property
    def residency_error(self) -> float:
        """The same against the residency view."""
        return ((self.bill_j - self.residency_j) / self.residency_j if self.residency_j > 0
                else math.nan)


async def _get_json(http: aiohttp.ClientSession, url: str,
                    headers: dict[str, str] | None = None) -> dict[str, Any] | None:
    try:
        async with http.get(url, headers=headers or {}) as resp:
            if resp.status != 200:
                await resp.read()
                return None
            doc: dict[str, Any] = orjson.loads(await resp.read())
            return doc
    except aiohttp.ClientError:
        return None


async def bills(http: aiohttp.ClientSession, gateway_url: str, ids: Sequence[str],
                wait_s: float, progress: Callable[[str], None]) -> dict[str, dict[str, Any]]:
    """The gateway's bill of every id, polled until final or `wait_s` passes (the last
    non-final bill is kept, flagged by its `final`)."""
    auth = {"authorization": f"Bearer {ADMIN_KEY}"}
    got: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + wait_s
    while True:
        todo = [i for i in ids if not got.get(i, {}).get("final")]
        for chunk_start in range(0, len(todo), 32):
            chunk = todo[chunk_start:chunk_start + 32]
            docs = await asyncio.gather(*(_get_json(
                http, f"{gateway_url}/admin/v1/requests/{i}", auth) for i in chunk))
            for i, doc in zip(chunk, docs, strict=True):
                if doc is not None:
                    got[i] = doc
        left = sum(not got.get(i, {}).get("final") for i in ids)
        if not left or time.monotonic() > deadline:
            return got
        progress(f"  waiting for {left} of {len(ids)} bills to be final")
        await asyncio.sleep(1.0)


async def truths(http: aiohttp.ClientSession, engine_urls: dict[str, str],
                 placed: dict[str, str]) -> dict[str, dict[str, Any]]:
    """The simulator's record of each request id -> engine name it was billed on."""
    out: dict[str, dict[str, Any]] = {}
    items = list(placed.items())
    for start in range(0, len(items), 32):
        chunk = items[start:start + 32]
        docs = await asyncio.gather(*(_get_json(
            http, f"{engine_urls[eng]}/sim/requests/{rid}") for rid, eng in chunk))
        for (rid, _), doc in zip(chunk, docs, strict=True):
            if doc is not None:
                out[rid] = doc
    return out


async def join(gateway_url: str, engine_urls: dict[str, str], sent: Sequence[Sent],
               wait_s: float, progress: Callable[[str], None]) -> list[Joined]:
    """Every request that got a gateway id, with its bill and its truth (0 J where the engine
    never ran it: refused, or failed before the engine)."""
    ids = [s.request_id for s in sent if s.request_id]
    async with aiohttp.ClientSession() as http:
        bill = await bills(http, gateway_url, ids, wait_s, progress)
        placed = {i: str(b["engine"]) for i, b in bill.items() if b.get("engine") in engine_urls}
        truth = await truths(http, engine_urls, placed)
    out = []
    for s in sent:
        if not s.request_id or s.request_id not in bill:
            continue
        b = bill[s.request_id]
        t = truth.get(s.request_id, {})
        out.append(Joined(s, str(b.get("engine", "")), str(b.get("status", "")),
                          bool(b.get("final")), float(b.get("energy_j", 0.0)),
                          float(t.get("truth_shapley_j", 0.0)), int(b.get("prompt_tokens", 0)),
                          int(b.get("completion_tokens", 0)),
                          int(t.get("completion_tokens", 0)),
                          float(t.get("truth_residency_j", 0.0)),
                          float(t.get("truth_shapley_stderr_j", 0.0))))
    return out


@dataclass(frozen=True, slots=True)
class EngineBalance:
    engine: str
    intervals: int
    metered_j: float
    shares_j: float
    idle_j: float

    @property
    def residual_j(self) -> float:
        return self.shares_j + self.idle_j - self.metered_j

    @property
    def exact(self) -> bool:
        """Conserved up to float rounding (one rounding per share, 1e-9 relative)."""
        return abs(self.residual_j) <= 1e-9 * max(self.metered_j, 1.0)


def balances(ledger: Path) -> list[EngineBalance]:
    """Per engine from the SQLite ledger: metered energy of its apportioned intervals, the
    shares charged in them and their idle account."""
    con = sqlite3.connect(f"file:{ledger}?mode=ro", uri=True, timeout=30)
    try:
        rows = con.execute(
            """SELECT i.engine, COUNT(*), SUM(i.energy_j), SUM(i.idle_j),
                      (SELECT COALESCE(SUM(s.energy_j), 0) FROM shares s
                        WHERE s.engine = i.engine)
               FROM intervals i GROUP BY i.engine ORDER BY i.engine""").fetchall()
    finally:
        con.close()
    return [EngineBalance(e, int(n), float(m or 0.0), float(sh or 0.0), float(idle or 0.0))
            for e, n, m, idle, sh in rows]
