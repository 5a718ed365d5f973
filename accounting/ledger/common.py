"""The ledger logic both stores share; a store supplies fetch, transaction and the lock."""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from collections.abc import Sequence
from operator import attrgetter
from typing import Any

import orjson

from accounting.chunks import in_chunks
from accounting.counters import CounterState
from accounting.failed import BILL_ALL, bill_until
from accounting.ledger import packs, retention, rollups, sql
from accounting.ledger import reservation_schema as reservations
from accounting.ledger.base import (
    EngineState,
    IntervalRow,
    PendingWork,
    RequestRow,
    ShareRow,
    UsageData,
    Watermark,
    WorkByEngine,
    WorkSnapshot,
    hour_of,
    work_by_engine,
)
from accounting.ledger.budget_store import Batch, Decide, Query
from accounting.ledger.tenant_cache import TenantCache
from accounting.work import WorkRow

TENANT_CHUNK = 500  # request ids per tenant lookup (well under SQLite's bound parameters)
WORK_CHUNK = 2048  # work rows read back between two yields to the event loop
# The columns of the rows read back, named as the SELECTs name them
STATE_FIELDS = tuple(sql.STATE_COLUMNS.split(", "))
INTERVAL_FIELDS = tuple(sql.INTERVAL_COLUMNS.split(", "))  # an IntervalRow's fields


ROLLUP_KEY = attrgetter("tenant", "finished_hour", "engine", "model", "precision", "slo_class")


def interval_params(i: IntervalRow) -> tuple[Any, ...]:
    return (i.engine, i.interval_idx, i.start_s, i.interval_s, i.model, i.precision, i.gpus,
            i.energy_j, i.static_j, i.dynamic_j, i.idle_j, i.idle_s, i.idle_carbon_g,
            i.idle_cost_usd, int(i.estimated), i.alpha, i.beta, i.gamma, i.failed_j,
            i.failed_carbon_g, i.failed_cost_usd, hour_of(i.start_s))


def counter_params(c: CounterState | None) -> tuple[Any, ...]:
    if c is None:
        return (None,) * 5
    return (c.seen_s, orjson.dumps(c.raw_j).decode(), orjson.dumps(c.offset_j).decode(),
            c.resets, c.metered_j)


def state_params(st: EngineState) -> tuple[Any, ...]:
    return (st.engine, st.next_interval, st.boundary_s, st.boundary_j, st.resets,
            *counter_params(st.counter), st.apportioned_j)


def state_of(r: Sequence[Any]) -> EngineState:
    """An engine_state row (sql.STATE_COLUMNS) as an EngineState."""
    c = dict(zip(STATE_FIELDS, r, strict=True))
    counter = None
    seen, raw, offset = c["counter_seen_s"], c["counter_raw_j"], c["counter_offset_j"]
    if seen is not None and raw is not None and offset is not None:
        # orjson writes the shortest repr of each float and reads it back to the same bits.
        metered = c["metered_j"]
        counter = CounterState(
            seen_s=float(seen), raw_j=tuple(map(float, orjson.loads(raw))),
            offset_j=tuple(map(float, orjson.loads(offset))),
            resets=int(c["counter_resets"] or 0),
            metered_j=None if metered is None else float(metered))
    apportioned = c["apportioned_j"]
    return EngineState(
        engine=c["engine"], next_interval=int(c["next_interval"]),
        boundary_s=float(c["boundary_s"]), boundary_j=float(c["boundary_j"]),
        resets=int(c["resets"]), counter=counter,
        apportioned_j=None if apportioned is None else float(apportioned))


def interval_of(r: Sequence[Any]) -> IntervalRow:
    """An intervals row (sql.INTERVAL_COLUMNS, which are IntervalRow's fields)."""
    c = dict(zip(INTERVAL_FIELDS, r, strict=True))
    c.update(interval_idx=int(c["interval_idx"]), gpus=int(c["gpus"]),
             estimated=bool(c["estimated"]))
    return IntervalRow(**c)


def _num(v: Any) -> Any:
    # PostgreSQL returns NUMERIC aggregates as Decimal; both stores hand back plain numbers.
    if v is None or isinstance(v, int | float | str):
        return v
    return float(v)


class SqlLedger(ABC):
    kind = "sql"
    # Whether two replicas' appends lock rows one by one (PostgreSQL), and so must take them
    # in one order; SQLite's writer holds the whole database instead
    row_locks = True

    def __init__(self) -> None:
        self._tenant_cache = TenantCache()
        self._boundaries: dict[str, float] = {}  # of the engines this process apportions
        # Why the store refuses all work for good (e.g. its file deleted while open), for
        # readiness checks; None while it works or fails only transiently.
        self.fault: str | None = None

    @abstractmethod
    async def open(self) -> None: ...

    @abstractmethod
    async def close(self) -> None: ...

    @abstractmethod
    async def _fetch(self, query: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]: ...

    async def _fetch_aside(self, query: str, params: tuple[Any, ...]
                           ) -> list[tuple[Any, ...]]:
        """`_fetch`, for a long read that the store's writes need not wait for."""
        return await self._fetch(query, params)

    @abstractmethod
    async def _snapshot(self, queries: Sequence[tuple[str, tuple[Any, ...]]]
                        ) -> list[list[tuple[Any, ...]]]:
        """Each query's rows, all read in one snapshot (one read transaction)."""

    @abstractmethod
    async def _transaction(self, batches: Sequence[Batch]) -> None: ...

    @abstractmethod
    async def _locked(self, key: int, queries: Sequence[Query], decide: Decide) -> None:
        """One write transaction, serialised with every other holding `key` on any replica:
        run `queries`, then the batches `decide` makes of their rows (`decide` is pure, and
        may run on the store's worker thread)."""

    # --- tenant controls (gateway/tenancy/store.py) ---------------------------------------

    async def locked(self, key: int, queries: Sequence[Query], decide: Decide) -> None:
        await self._locked(key, queries, decide)

    async def settle_reservations(self, changes: Sequence[tuple[str, Sequence[Any] | None]],
                                  before: Sequence[Query] = ()) -> None:
        """In one transaction: the statements `before` first, then, in the order given,
        settle reservations (request id and its reservation_schema.SETTLE_RESERVATION row)
        and drop those of requests that no engine ran (request id and None)."""
        batches: list[Batch] = [(q, [p for _, p in run])
                                for q, run in itertools.groupby(before, key=lambda b: b[0])]
        for dropped, run in itertools.groupby(changes, key=lambda c: c[1] is None):
            if dropped:
                batches.append((reservations.DELETE_RESERVATION, [(rid,) for rid, _ in run]))
            else:
                batches.append((reservations.SETTLE_RESERVATION, [row for _, row in run if row]))
        await self._transaction(batches)

    async def tenant_hours(self, tenant: str, since_hour: int
                           ) -> list[tuple[int, float, float, float]]:
        rows = await self._fetch(sql.SELECT_TENANT_HOURS, (tenant, since_hour))
        return [(int(hour), float(energy), float(carbon), float(cost))
                for hour, energy, carbon, cost in rows]

    async def reservations_held(self, tenant: str, young_s: float, live_s: float,
                                expired_s: float) -> tuple[float, float, float, int]:
        """(J, gCO2e, USD) held by a tenant's live reservations, and how many are open."""
        rows = await self._fetch(reservations.SELECT_HELD, (young_s, live_s, tenant, expired_s))
        energy, carbon, cost, open_now = rows[0]
        return float(energy), float(carbon), float(cost), int(open_now)

    async def live_replicas(self, seen_after_s: float) -> int:
        rows = await self._fetch(sql.SELECT_LIVE_REPLICAS, (seen_after_s,))
        return int(rows[0][0]) if rows else 0

    async def tenant_bills(self, tenant: str, since_s: float, interval_s: float, limit: int
                           ) -> list[tuple[str, int, int, float, float, float]]:
        """A tenant's latest `limit` final requests whose shares are all since `since_s`
        (they arrived an interval later): (precision, prompt tokens, completion tokens, J,
        gCO2e, USD) each."""
        rows = await self._fetch_aside(sql.SELECT_TENANT_BILLS,
                                       (since_s, tenant, since_s + interval_s, limit))
        return [(str(p), int(pt or 0), int(ct or 0), float(e or 0), float(c or 0),
                 float(u or 0)) for p, pt, ct, e, c, u in rows]

    async def append(self, requests: Sequence[RequestRow], work: WorkByEngine,
                     watermark: Watermark | None = None) -> None:
        if not requests and not work and watermark is None:
            return
        packed = packs.pack_params(work_by_engine(work))
        # The watermark moves with the rows it accounts for, never ahead of them. Each
        # interval's version is bumped before its pack is written: the pack is keyed by it.
        # Requests in the order of their rollup rows, versions in key order: two replicas'
        # appends lock those rows (on PostgreSQL, request_hours by rollup_schema.py's
        # trigger) in the same order. Where no row is locked alone, the requests stay in
        # their finishing order (sorting them was a microsecond of every record).
        ordered = sorted(requests, key=ROLLUP_KEY) if self.row_locks else requests
        await self._transaction([(sql.INSERT_REQUEST, ordered),
                                 (sql.UPSERT_VERSION, sorted(p[:2] for p in packed)),
                                 (packs.INSERT_PACK, packed),
                                 (sql.UPSERT_REPLICA, [] if watermark is None else [watermark])])
        # The apportioner reads these requests' work back soon: their tenants need no lookup.
        add = self._tenant_cache.add
        for r in requests:
            add(r.request_id, r.tenant, r.finished_s,
                _cut(r.outcome, r.delivered_s) if r.outcome == "failed" else None)

    async def open_since(self, seen_after_s: float) -> float | None:
        rows = await self._fetch(sql.SELECT_OPEN_SINCE, (seen_after_s,))
        return None if not rows or rows[0][0] is None else float(rows[0][0])

    async def states(self) -> dict[str, EngineState]:
        rows = await self._fetch(sql.SELECT_STATES, ())
        return {st.engine: st for st in map(state_of, rows)}

    async def snapshot(self, engine: str, ranges: Sequence[tuple[int, int]]) -> WorkSnapshot:
        queries = [(q, (engine, first, last)) for first, last in ranges
                   for q in (sql.SELECT_WORK, packs.SELECT_PACKS, sql.SELECT_VERSIONS)]
        results = await self._snapshot(queries)
        # each range's rows written per row (sql.SELECT_WORK's columns are a WorkRow's) and
        # in packs, each (request, interval) once
        rows = [w for i in range(0, len(results), 3)
                for w in packs.unpack(results[i], results[i + 1])]
        versions = {int(k): int(v) for res in results[2::3] for k, v in res}
        return WorkSnapshot(await self._with_tenants(rows), versions)

    async def _with_tenants(self, rows: list[WorkRow]) -> list[PendingWork]:
        tenants, cuts = await self._tenants({w[0] for w in rows})
        tenant_of, cut_of = tenants.get, cuts.get
        out: list[PendingWork] = []
        make = PendingWork._make
        async for part in in_chunks(rows, WORK_CHUNK):  # a busy interval holds thousands
            out += [make((tenant_of(w.request_id, ""), w, cut_of(w.request_id, BILL_ALL)))
                    for w in part]
        return out

    async def _tenants(self, request_ids: set[str]) -> tuple[dict[str, str], dict[str, float]]:
        """Tenant, and billing cut where not BILL_ALL, by request id. A request's tenant never
        changes once written, and its work is read interval after interval: each is looked
        up once, then kept until its work is apportioned (tenant_cache.py)."""
        cache = self._tenant_cache
        tenants = {r: cache.get(r, "") for r in request_ids}
        cuts = {r: c for r in request_ids if (c := cache.cut(r, BILL_ALL)) != BILL_ALL}
        missing = cache.missing(request_ids)
        for i in range(0, len(missing), TENANT_CHUNK):
            chunk = tuple(missing[i:i + TENANT_CHUNK])
            query = sql.with_marks(sql.SELECT_TENANTS, len(chunk))
            for rid, tenant, outcome, delivered in await self._fetch(query, chunk):
                cut = _cut(outcome, delivered) if outcome == "failed" else None
                cache.add(rid, tenant, None, cut)
                tenants[rid] = tenant
                if cut is not None:
                    cuts[rid] = cut
        return tenants, cuts

    async def tenant_shares(self, engine: str, first: int, last: int
                            ) -> list[tuple[int, str, float, float, float]]:
        rows = await self._fetch(sql.SELECT_TENANT_SHARES, (engine, first, last))
        return [(int(k), tenant, float(energy), float(carbon), float(cost))
                for k, tenant, energy, carbon, cost in rows]

    async def dirty(self, engine: str, before: int) -> list[int]:
        return [int(k) for (k,) in await self._fetch(sql.SELECT_DIRTY, (engine, before))]

    async def intervals(self, engine: str, idxs: Sequence[int]) -> list[IntervalRow]:
        if not idxs:
            return []
        wanted = set(idxs)
        rows = await self._fetch(sql.SELECT_INTERVALS, (engine, min(idxs), max(idxs)))
        return [i for i in map(interval_of, rows) if i.interval_idx in wanted]

    async def commit(self, engine: str, intervals: Sequence[IntervalRow],
                     shares: Sequence[ShareRow], done: Sequence[tuple[int, int]],
                     state: EngineState | None) -> None:
        # The hourly rollups move with the intervals and shares, in one transaction.
        batches: list[Batch] = [
            (rollups.ENGINE_HOURS_ADD, rollups.engine_hours_params(-1, engine, intervals)),
            (sql.UPSERT_INTERVAL, [interval_params(i) for i in intervals]),
            (rollups.ENGINE_HOURS_ADD, rollups.engine_hours_params(1, engine, intervals)),
            (rollups.SHARE_HOURS_ADD, rollups.share_hours_params(-1, engine, intervals)),
            (sql.DELETE_SHARES, [(engine, i.interval_idx) for i in intervals]),
            (sql.INSERT_SHARE, shares),
            (rollups.SHARE_HOURS_ADD, rollups.share_hours_params(1, engine, intervals)),
            (sql.CLEAR_DIRTY, [(engine, k, version) for k, version in sorted(done)]),
        ]
        if state is not None:
            batches.append((sql.UPSERT_STATE, [state_params(state)]))
        await self._transaction(batches)
        if state is not None:
            # work before every engine's boundary is read no more (but late work's)
            self._boundaries[engine] = state.boundary_s
            self._tenant_cache.settle(min(self._boundaries.values()))

    async def store_counter(self, engine: str, counter: CounterState) -> None:
        await self._transaction([(sql.UPDATE_COUNTER, [(*counter_params(counter), engine)])])

    async def request(self, request_id: str) -> dict[str, Any] | None:
        rows = await self._fetch(sql.SELECT_REQUEST, (request_id,))
        if not rows:
            return None
        out: dict[str, Any] = dict(zip(sql.REQUEST_COLUMNS, rows[0], strict=True))
        out["stream"] = bool(out["stream"])
        out["slo_met"] = bool(out["slo_met"])
        first, last = out["first_interval"], out["last_interval"]
        n, energy, static, dynamic, gpu_s, carbon, cost, est, failed = (
            (await self._fetch(sql.SELECT_REQUEST_TOTALS, (
                first, first if last is None else last, out["engine"], request_id)))[0]
            if first is not None else (0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0, 0.0))
        pending = 0 if first is None else (await self._fetch(sql.SELECT_REQUEST_PENDING, (
            out["engine"], first, first if last is None else last)))[0][0]
        final = True
        if out["last_interval"] is not None:
            nxt = await self._fetch(sql.SELECT_NEXT_INTERVAL, (out["engine"],))
            # Final once the interval after its finish is apportioned and no interval of its
            # span has late work waiting (a revision would change its share).
            final = bool(nxt) and int(nxt[0][0]) >= int(out["last_interval"]) + 2 and pending == 0
        out.update(energy_j=_num(energy), static_j=_num(static), dynamic_j=_num(dynamic),
                   gpu_s=_num(gpu_s), carbon_g=_num(carbon), cost_usd=_num(cost),
                   energy_kwh=_num(energy) / 3.6e6, intervals=int(n), final=final,
                   estimated=bool(est), failed_energy_j=_num(failed))
        return out

    async def prune(self, before_s: float, interval_s: float,
                    batch_rows: int = retention.PRUNE_BATCH_ROWS) -> bool:
        return await retention.prune(self._fetch, self._transaction, before_s, interval_s,
                                     batch_rows)

    async def usage(self, since_s: float, until_s: float, tenant: str | None, *,
                    per_request: bool = False,
                    group_by: Sequence[str] = rollups.USAGE_DIMS) -> UsageData:
        return await rollups.read_usage(self._fetch, since_s, until_s, tenant,
                                        per_request=per_request, group_by=group_by)


def _cut(outcome: str, delivered_s: float | None) -> float:
    """A request's billing cut should failures go to the failed account (the apportioner
    applies the config's switch)."""
    return bill_until(outcome, None if delivered_s is None else float(delivered_s),
                      "failed_account")
