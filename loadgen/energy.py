"""Per-request energy, carbon and cost from the gateway's accounting, fetched after a run.

`GET /admin/v1/requests/{request_id}` (admin key as Bearer) returns the request's apportioned
energy_j, carbon_g, cost_usd, with `final` (its intervals are all apportioned) and `estimated`
(from a power model, not a hardware counter). Aggregation is pure; when no request has an
accounting record the energy columns are "n/a" with the reason.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import aiohttp
import orjson

from loadgen.results import RequestResult

ADMIN_TIMEOUT = aiohttp.ClientTimeout(total=60.0, sock_connect=5.0)


def admin_session() -> aiohttp.ClientSession:
    """A session for the few JSON reads after a run (the gateway's admin API, a simulated
    engine's truth); the load itself goes through loadgen/client.py."""
    # Auto-decompression and cookie handling add work per response and are never needed here.
    return aiohttp.ClientSession(timeout=ADMIN_TIMEOUT, auto_decompress=False,
                                 cookie_jar=aiohttp.DummyCookieJar())


@dataclass(frozen=True, slots=True)
class EnergyRow:
    request_id: str
    tenant: str
    model: str
    engine: str
    precision: str
    prompt_tokens: int
    completion_tokens: int
    energy_j: float
    carbon_g: float
    cost_usd: float
    final: bool
    estimated: bool


@dataclass(frozen=True, slots=True)
class EnergyFetch:
    rows: dict[str, EnergyRow]  # by request id
    missing: int  # requests with an id but no record
    no_id: int  # requests without a gateway request id (engine targeted directly, or refused)
    reason: str  # why energy is unavailable or partial; "" when complete
    source: str = "gateway"  # "gateway": apportioned measurement; "sim": simulator ground truth
    by_gateway_id: bool = True  # rows keyed by the gateway's request id, else by x-request-id

    def row(self, r: RequestResult) -> EnergyRow | None:
        key = r.request_id if self.by_gateway_id else r.client_request_id
        return self.rows.get(key) if key and r.ok else None


def parse_row(data: dict[str, object]) -> EnergyRow:
    def num(key: str) -> float:
        v = data.get(key)
        return float(v) if isinstance(v, int | float) else 0.0

    return EnergyRow(
        request_id=str(data["request_id"]), tenant=str(data.get("tenant", "")),
        model=str(data.get("model", "")), engine=str(data.get("engine", "")),
        precision=str(data.get("precision", "")), prompt_tokens=int(num("prompt_tokens")),
        completion_tokens=int(num("completion_tokens")), energy_j=num("energy_j"),
        carbon_g=num("carbon_g"), cost_usd=num("cost_usd"), final=bool(data.get("final", False)),
        estimated=bool(data.get("estimated", False)))


async def fetch_energy(session: aiohttp.ClientSession, base_url: str, admin_key: str,
                       results: Sequence[RequestResult], *, wait_final_s: float = 5.0,
                       concurrency: int = 16) -> EnergyFetch:
    """Fetch each request's record; re-poll non-final ones until `wait_final_s` has passed."""
    ids = [r.request_id for r in results if r.request_id]
    no_id = len(results) - len(ids)
    if not ids:
        return EnergyFetch({}, 0, no_id, "no gateway request ids (target is not a wattgate "
                                          "gateway, or every request was refused)")
    headers = {"Authorization": f"Bearer {admin_key}"} if admin_key else {}
    sem = asyncio.Semaphore(concurrency)
    statuses: list[int] = []
    rows: dict[str, EnergyRow] = {}

    async def one(rid: str) -> None:
        url = f"{base_url.rstrip('/')}/admin/v1/requests/{rid}"
        async with sem:
            try:
                async with session.get(url, headers=headers) as resp:
                    statuses.append(resp.status)
                    if resp.status == 200:
                        rows[rid] = parse_row(orjson.loads(await resp.read()))
            except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError, KeyError):
                statuses.append(0)

    deadline = time.monotonic() + wait_final_s
    pending = ids
    while True:
        await asyncio.gather(*(one(rid) for rid in pending))
        pending = [rid for rid in ids if rid in rows and not rows[rid].final]
        if not pending or time.monotonic() >= deadline:
            break
        await asyncio.sleep(0.5)
    missing = len(ids) - len(rows)
    if not rows:
        kinds = sorted(set(statuses))
        why = {401: "admin key refused (401)", 403: "admin key refused (403)",
               404: "gateway has no accounting record for these requests (404)",
               0: "accounting endpoint unreachable"}
        reason = "; ".join(why.get(s, f"HTTP {s}") for s in kinds)
    elif missing or pending:
        reason = f"{missing} requests without a record, {len(pending)} not final yet"
    else:
        reason = ""
    return EnergyFetch(rows, missing, no_id, reason)


async def fetch_sim_energy(session: aiohttp.ClientSession, engine_urls: Sequence[str],
                           results: Sequence[RequestResult], *, by_gateway_id: bool = False,
                           concurrency: int = 16) -> EnergyFetch:
    """Ground-truth energy from simulated engines (`GET /sim/requests/{id}`), for runs against a
    simulated engine directly (id = the x-request-id we sent) or through a gateway without
    accounting (id = the gateway's request id, which it forwards as x-request-id). Each id is
    looked up on each engine until one knows it. Carbon and cost are not known there (NaN)."""
    ids = [(r.request_id if by_gateway_id else r.client_request_id) for r in results if r.ok]
    ids = [i for i in ids if i]
    sem = asyncio.Semaphore(concurrency)
    rows: dict[str, EnergyRow] = {}
    statuses: set[int] = set()

    async def one(rid: str) -> None:
        async with sem:
            for url in engine_urls:
                try:
                    async with session.get(f"{url.rstrip('/')}/sim/requests/{rid}") as resp:
                        statuses.add(resp.status)
                        if resp.status != 200:
                            continue
                        d = orjson.loads(await resp.read())
                        rows[rid] = EnergyRow(
                            request_id=rid, tenant="", model="", engine=url, precision="",
                            prompt_tokens=int(d["prompt_tokens"]),
                            completion_tokens=int(d["completion_tokens"]),
                            energy_j=float(d["energy_j"]), carbon_g=math.nan,
                            cost_usd=math.nan, final=True, estimated=False)
                        return
                except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError, KeyError,
                        TypeError, ValueError):
                    statuses.add(0)

    await asyncio.gather(*(one(rid) for rid in ids))
    if not ids:
        reason = "no successful request to look up"
    elif not rows:
        reason = (f"no energy source: the target is not a wattgate gateway (no "
                  f"x-wattgate-request-id) and has no simulator records (HTTP {sorted(statuses)})")
    elif len(rows) < len(ids):
        reason = (f"{len(ids) - len(rows)} of {len(ids)} requests without a simulator record "
                  f"(HTTP {sorted(statuses)})")
    else:
        reason = ""
    return EnergyFetch(rows, len(ids) - len(rows), len(results) - len(ids), reason, "sim",
                       by_gateway_id)


@dataclass(frozen=True, slots=True)
class EnergyStats:
    """Energy over a group of successful requests that have a record."""

    name: str
    requests: int
    output_tokens: int
    total_tokens: int
    energy_j: float
    j_per_request: float
    j_per_output_token: float
    carbon_g_per_1k_tokens: float  # per 1000 tokens (prompt + completion)
    usd_per_1k_tokens: float
    estimated: int  # how many came from a power model rather than a hardware counter
    not_final: int
    carbon_g: float = 0.0  # the group's bill: grams CO2e and USD in all
    cost_usd: float = 0.0


def energy_stats(name: str, rows: Iterable[EnergyRow]) -> EnergyStats | None:
    rs = list(rows)
    if not rs:
        return None
    out = sum(r.completion_tokens for r in rs)
    total = out + sum(r.prompt_tokens for r in rs)
    e = sum(r.energy_j for r in rs)
    return EnergyStats(
        name=name, requests=len(rs), output_tokens=out, total_tokens=total, energy_j=e,
        j_per_request=e / len(rs), j_per_output_token=e / out if out else float("nan"),
        carbon_g_per_1k_tokens=1000 * sum(r.carbon_g for r in rs) / total if total else 0.0,
        usd_per_1k_tokens=1000 * sum(r.cost_usd for r in rs) / total if total else 0.0,
        estimated=sum(1 for r in rs if r.estimated), not_final=sum(1 for r in rs if not r.final),
        carbon_g=sum(r.carbon_g for r in rs), cost_usd=sum(r.cost_usd for r in rs))


def group_energy(fetch: EnergyFetch, results: Sequence[RequestResult], by: str
                 ) -> tuple[EnergyStats, ...]:
    """Energy per "tenant" or "precision" (from the record) over successful requests."""
    groups: dict[str, list[EnergyRow]] = {}
    for r in results:
        row = fetch.row(r)
        if row is None:
            continue
        key = r.tenant if by == "tenant" else row.precision
        groups.setdefault(key, []).append(row)
    return tuple(s for k in sorted(groups) if (s := energy_stats(k, groups[k])) is not None)


def overall_energy(fetch: EnergyFetch, results: Sequence[RequestResult], name: str = "all"
                   ) -> EnergyStats | None:
    return energy_stats(name, (row for r in results if (row := fetch.row(r)) is not None))
