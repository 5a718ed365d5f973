"""Hourly rollups (schema: rollup_schema.py): how the apportioner's commit keeps them, and
how usage is read from them.

A usage window [since, until) is read as its whole hours from the rollups and its partial
edges from the per-request rows: the rollups hold, per hour, exactly the rows the per-request
queries would select for that hour (shares and intervals by the hour they start, requests by
the hour they finish), so both reads give one answer where both rows exist. Before the
retention (retention.py), only the rollups remain: a window there counts its whole hours.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NamedTuple

from accounting.ledger import sql
from accounting.ledger.base import HOUR_S, IntervalRow, UsageData
from accounting.ledger.rollup_schema import (
    ENGINE_DIMS,
    ENGINE_SUMS,
    SHARE_DIMS,
    SHARE_SUMS,
    UPSERT_ENGINE_HOURS,
    UPSERT_SHARE_HOURS,
)

Fetch = Callable[[str, tuple[Any, ...]], Awaitable[list[tuple[Any, ...]]]]

# One interval's shares added to (sign 1) or taken from (sign -1, before they are replaced)
# the hourly rollup; params: the sign as an integer, five times as a float, as an integer,
# then engine and interval.
SHARE_HOURS_ADD = f"""INSERT INTO share_hours ({SHARE_DIMS}, {SHARE_SUMS})
    SELECT r.tenant, s.hour_idx, s.engine, r.model, r.precision, r.slo_class, ? * COUNT(*),
    ? * SUM(s.energy_j), ? * SUM(s.static_j), ? * SUM(s.carbon_g), ? * SUM(s.cost_usd),
    ? * SUM(s.failed_j), ? * SUM(s.estimated)
    FROM shares s JOIN requests r ON r.request_id = s.request_id
    WHERE s.engine = ? AND s.interval_idx = ?
    GROUP BY r.tenant, s.hour_idx, s.engine, r.model, r.precision, r.slo_class
    {UPSERT_SHARE_HOURS}"""
# One interval's row added to (1) or taken from (-1, before it is replaced) its engine's
# hour; params as SHARE_HOURS_ADD's, the float seven times.
ENGINE_HOURS_ADD = f"""INSERT INTO engine_hours ({ENGINE_DIMS}, {ENGINE_SUMS}, first_start_s,
    last_end_s) SELECT engine, hour_idx, model, precision, CAST(? AS BIGINT),
    ? * energy_j, ? * idle_j, ? * idle_carbon_g, ? * idle_cost_usd, ? * failed_j,
    ? * failed_carbon_g, ? * failed_cost_usd, ? * estimated, start_s, start_s + interval_s
    FROM intervals WHERE engine = ? AND interval_idx = ?
    {UPSERT_ENGINE_HOURS}"""


def share_hours_params(sign: int, engine: str, intervals: Sequence[IntervalRow]
                       ) -> list[tuple[Any, ...]]:
    f = float(sign)
    return [(sign, f, f, f, f, f, sign, engine, i.interval_idx) for i in intervals]


def engine_hours_params(sign: int, engine: str, intervals: Sequence[IntervalRow]
                        ) -> list[tuple[Any, ...]]:
    f = float(sign)
    return [(sign, f, f, f, f, f, f, f, sign, engine, i.interval_idx) for i in intervals]


# Reads: the columns of UsageData's lists, from the rollups of hours [first, last), summed in
# the store over the dimensions a report does not group by (those read as '' or hour 0).
USAGE_DIMS = ("tenant", "model", "precision", "engine", "hour")
_ENERGY = """SELECT {tenant}, {model}, {precision}, {engine}, {hour}, SUM(energy_j),
    SUM(static_j), SUM(carbon_g), SUM(cost_usd),
    MAX(CASE WHEN estimated_n > 0 THEN 1 ELSE 0 END), SUM(failed_j) FROM share_hours
    WHERE hour_idx >= ? AND hour_idx < ? {TENANT} {GROUP} HAVING SUM(shares) > 0"""
_REQUESTS = """SELECT {tenant}, {model}, {precision}, {engine}, {hour},
    CAST(SUM(requests) AS BIGINT), CAST(SUM(ok) AS BIGINT), CAST(SUM(prompt_tokens) AS BIGINT),
    CAST(SUM(completion_tokens) AS BIGINT), CAST(SUM(slo_met) AS BIGINT),
    MIN(first_arrived_s), MAX(last_finished_s), CAST(SUM(served) AS BIGINT),
    CAST(SUM(refused) AS BIGINT), CAST(SUM(failed) AS BIGINT), CAST(SUM(cancelled) AS BIGINT)
    FROM request_hours WHERE hour_idx >= ? AND hour_idx < ? {TENANT} {GROUP}
    HAVING SUM(requests) > 0"""
_ACCOUNTS = """SELECT {engine}, {model}, {precision}, {hour}, SUM(idle_j), SUM(idle_carbon_g),
    SUM(idle_cost_usd), MAX(CASE WHEN estimated_n > 0 THEN 1 ELSE 0 END), MIN(first_start_s),
    MAX(last_end_s), SUM(failed_j), SUM(failed_carbon_g), SUM(failed_cost_usd)
    FROM engine_hours WHERE hour_idx >= ? AND hour_idx < ? {GROUP}
    HAVING SUM(intervals) > 0"""


def _grouped(template: str, group_by: Sequence[str], dims: Sequence[str]) -> str:
    """`template` summed over every dimension but `group_by` (HAVING drops the one row an
    aggregate without GROUP BY returns for no rows)."""
    bad = [g for g in group_by if g not in USAGE_DIMS]
    if bad:
        raise ValueError(f"cannot group by {bad[0]!r}; use {', '.join(USAGE_DIMS)}")
    column = {d: "hour_idx" if d == "hour" else d for d in USAGE_DIMS}
    kept = [column[d] for d in dims if d in group_by]
    return template.format(
        **{d: column[d] if d in group_by else "0" if d == "hour" else "''" for d in dims},
        GROUP=f"GROUP BY {', '.join(kept)}" if kept else "", TENANT="{TENANT}")


WINDOW_END_S = 1e15  # some 30 million years: hour indices far inside 64 bits


def whole_hours(since_s: float, until_s: float) -> tuple[int, int] | None:
    """The whole hours [first, last) inside [since, until); None when there are none."""
    first, last = math.ceil(since_s / HOUR_S), math.floor(until_s / HOUR_S)
    return (first, last) if first < last else None


class IntervalAccounts(NamedTuple):
    """A row of sql.USAGE_IDLE (or its hourly rollup): an engine's idle and failed accounts
    in one hour."""

    engine: str
    model: str
    precision: str
    hour_idx: int
    idle_j: float
    idle_carbon_g: float
    idle_cost_usd: float
    estimated: int
    first_start_s: float
    last_end_s: float
    failed_j: float
    failed_carbon_g: float
    failed_cost_usd: float


async def read_usage(fetch: Fetch, since_s: float, until_s: float, tenant: str | None, *,
                     per_request: bool = False, group_by: Sequence[str] = USAGE_DIMS
                     ) -> UsageData:
    """Usage of [since, until): its whole hours from the rollups, the rest from the
    per-request rows (all of it from them with `per_request`). The rollups' rows come summed
    over the dimensions not in `group_by` (their values '' or hour 0), the per-request rows
    per tenant, model, precision, engine and hour: a report groups them alike."""
    # nothing lies before the epoch nor past WINDOW_END_S: a window reaching further (since
    # -1e300, until 1e300) reads as that span, its hours integers the stores can hold
    since_s, until_s = max(since_s, 0.0), min(until_s, WINDOW_END_S)
    hours = None if per_request else whole_hours(since_s, until_s)
    if hours is None:
        return await _read(fetch, (sql.USAGE_ENERGY, sql.USAGE_REQUESTS, sql.USAGE_IDLE),
                           since_s, until_s, tenant, ("r.tenant", "tenant"))
    first, last = hours
    shaped = (_grouped(_ENERGY, group_by, USAGE_DIMS), _grouped(_REQUESTS, group_by, USAGE_DIMS),
              _grouped(_ACCOUNTS, group_by, ("engine", "model", "precision", "hour")))
    parts = [await _read(fetch, shaped, first, last, tenant, ("tenant", "tenant"))]
    for lo, hi in ((since_s, first * HOUR_S), (last * HOUR_S, until_s)):
        if lo < hi:
            parts.append(await _read(fetch, (sql.USAGE_ENERGY, sql.USAGE_REQUESTS,
                                             sql.USAGE_IDLE), lo, hi, tenant,
                                     ("r.tenant", "tenant")))
    return UsageData(energy=[r for p in parts for r in p.energy],
                     requests=[r for p in parts for r in p.requests],
                     idle=[r for p in parts for r in p.idle],
                     failed=[r for p in parts for r in p.failed])


async def _read(fetch: Fetch, queries: tuple[str, str, str], lo: float, hi: float,
                tenant: str | None, columns: tuple[str, str]) -> UsageData:
    energy_q, requests_q, accounts_q = queries
    extra: tuple[Any, ...] = (tenant,) if tenant else ()
    energy = await fetch(sql.usage_sql(energy_q, bool(tenant), columns[0]), (lo, hi, *extra))
    reqs = await fetch(sql.usage_sql(requests_q, bool(tenant), columns[1]), (lo, hi, *extra))
    accounts = [] if tenant else list(map(IntervalAccounts._make,
                                          _plain(await fetch(accounts_q, (lo, hi)))))
    # one read for both engine accounts: idle, and failed where it holds any
    idle: list[tuple[Any, ...]] = [
        (a.engine, a.model, a.precision, a.hour_idx, a.idle_j, a.idle_carbon_g,
         a.idle_cost_usd, a.estimated, a.first_start_s, a.last_end_s) for a in accounts]
    failed: list[tuple[Any, ...]] = [
        (a.engine, a.model, a.precision, a.hour_idx, a.failed_j, a.failed_carbon_g,
         a.failed_cost_usd, a.estimated) for a in accounts if a.failed_j]
    return UsageData(energy=_plain(energy), requests=_plain(reqs), idle=idle, failed=failed)


def _num(v: Any) -> Any:
    # PostgreSQL returns NUMERIC aggregates as Decimal; both stores hand back plain numbers.
    if v is None or isinstance(v, int | float | str):
        return v
    return float(v)


def _plain(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return [tuple(_num(v) for v in r) for r in rows]
