"""The shared rate-limit store: one token bucket per (tenant, limit) in PostgreSQL (asyncpg).

PostgreSQL because the replicas already share a PostgreSQL ledger: no other service to run,
secure and back up. Every lease of a replica's is one statement, `INSERT ... ON CONFLICT DO
UPDATE ... RETURNING` over all the buckets it asks of at once: the row is locked for the
statement, so leases of several replicas are applied one after the other, each on the bucket
the previous one left. The arithmetic is lease.py's `exchange`, on the database's clock, so
the replicas' clocks need not agree. Each replica also stamps a row in `rate_limit_replicas`;
the live ones give the share a replica falls back to when the store is down.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import asyncpg

from gateway.tenancy.lease import Exchange

SCHEMA_LOCK = 0x7761_7474_7261_7465  # "wattrate": replicas starting together create it once
REPLICA_LIVE_S = 10.0  # a replica not heard from for this long holds no share
# and its row goes after this long (one killed without a stop leaves its row behind)
REPLICA_FORGET_S = 3600.0

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS rate_limit_buckets (
        tenant TEXT NOT NULL,
        lim TEXT NOT NULL,
        capacity DOUBLE PRECISION NOT NULL,
        period_s DOUBLE PRECISION NOT NULL,
        level DOUBLE PRECISION NOT NULL,
        at_s DOUBLE PRECISION NOT NULL,
        asked DOUBLE PRECISION NOT NULL,
        granted DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (tenant, lim))""",
    """CREATE TABLE IF NOT EXISTS rate_limit_replicas (
        replica TEXT PRIMARY KEY,
        seen_s DOUBLE PRECISION NOT NULL)""",
)

# The bucket refilled to now, as lease.py's `refilled` (EXCLUDED: this statement's row).
_FULL = ("LEAST(EXCLUDED.capacity, b.level + GREATEST(0, EXCLUDED.at_s - b.at_s)"
         " * EXCLUDED.capacity / EXCLUDED.period_s)")
_GRANT = f"GREATEST(0, LEAST(EXCLUDED.asked, {_FULL}))"
# lease.py's `exchange`: a new row is a full bucket; `asked` < 0 gives tokens back. Rows are
# locked in one order on every replica: two statements taking the same rows in opposite
# orders would deadlock, and PostgreSQL would abort one (a store down, to its replica).
EXCHANGE = f"""
INSERT INTO rate_limit_buckets AS b (tenant, lim, capacity, period_s, level, at_s, asked,
                                     granted)
SELECT a.tenant, a.lim, a.capacity, a.period_s,
       a.capacity - GREATEST(0, LEAST(a.amount, a.capacity)),
       extract(epoch FROM clock_timestamp()), a.amount, GREATEST(0, LEAST(a.amount, a.capacity))
FROM unnest($1::text[], $2::text[], $3::float8[], $4::float8[], $5::float8[])
     AS a(tenant, lim, capacity, period_s, amount)
ORDER BY a.tenant, a.lim
ON CONFLICT (tenant, lim) DO UPDATE SET
    capacity = EXCLUDED.capacity, period_s = EXCLUDED.period_s, asked = EXCLUDED.asked,
    at_s = GREATEST(b.at_s, EXCLUDED.at_s),
    granted = {_GRANT},
    level = LEAST(EXCLUDED.capacity, {_FULL} - {_GRANT} - LEAST(EXCLUDED.asked, 0))
RETURNING tenant, lim, granted, level"""
HEARTBEAT = """
WITH gone AS (
    DELETE FROM rate_limit_replicas
    WHERE seen_s < extract(epoch FROM clock_timestamp())::float8 - $3::float8),
seen AS (
    INSERT INTO rate_limit_replicas (replica, seen_s)
    VALUES ($1, extract(epoch FROM clock_timestamp()))
    ON CONFLICT (replica) DO UPDATE SET seen_s = EXCLUDED.seen_s)
SELECT count(*) FROM rate_limit_replicas
WHERE replica <> $1 AND seen_s > extract(epoch FROM clock_timestamp())::float8 - $2::float8"""
FORGET = "DELETE FROM rate_limit_replicas WHERE replica = $1"

# what a broken or unreachable store raises (a timeout included)
_DOWN = (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError)


class RateStoreError(Exception):
    """The store did not answer (unreachable, too slow, or it refused the statement)."""


@dataclass(frozen=True, slots=True)
class Ask:
    """One bucket's row of a lease: `amount` > 0 asks, < 0 gives back."""

    tenant: str
    limit: str  # "rps", "rpm" or "tpm"
    capacity: float
    period_s: float
    amount: float


class BucketStore(Protocol):
    """What shared.py needs of a store (tests give it one in memory, on a fake clock)."""

    async def exchange(self, asks: Sequence[Ask]) -> dict[tuple[str, str], Exchange]: ...

    async def heartbeat(self, replica: str) -> int: ...

    async def forget(self, replica: str) -> None: ...

    async def close(self) -> None: ...


class RateStore:
    """The store in PostgreSQL."""

    def __init__(self, dsn: str, timeout_s: float):
        self._dsn = dsn
        self.timeout_s = timeout_s
        self._pool: Any = None
        self._opening = asyncio.Lock()  # one pool, however many leases find none

    async def _ready(self) -> Any:
        if self._pool is not None:
            return self._pool
        async with self._opening:
            if self._pool is not None:
                return self._pool
            # min_size 0: no floor for asyncpg to restore (and log a traceback about every
            # second) while the store is down; connections are opened as leases need them
            pool = await asyncpg.create_pool(self._dsn, min_size=0, max_size=2,
                                             command_timeout=self.timeout_s)
            try:
                async with pool.acquire() as conn, conn.transaction():
                    await conn.execute("SELECT pg_advisory_xact_lock($1)", SCHEMA_LOCK)
                    for statement in SCHEMA:
                        await conn.execute(statement)
            except BaseException:  # a timeout too: no half-open pool left behind
                pool.terminate()
                raise
            self._pool = pool
        return self._pool

    async def _fetch(self, query: str, *args: Any) -> list[Any]:
        try:
            async with asyncio.timeout(self.timeout_s):
                pool = await self._ready()
                return list(await pool.fetch(query, *args))
        except _DOWN as exc:
            raise RateStoreError(f"{type(exc).__name__}: {exc}") from exc

    async def exchange(self, asks: Sequence[Ask]) -> dict[tuple[str, str], Exchange]:
        """One statement for all `asks` (at most one per bucket): what each was granted."""
        rows = await self._fetch(EXCHANGE, [a.tenant for a in asks], [a.limit for a in asks],
                                 [a.capacity for a in asks], [a.period_s for a in asks],
                                 [a.amount for a in asks])
        return {(r["tenant"], r["lim"]): Exchange(float(r["granted"]), float(r["level"]))
                for r in rows}

    async def heartbeat(self, replica: str) -> int:
        """Stamp this replica live; the live replicas, this one included."""
        rows = await self._fetch(HEARTBEAT, replica, REPLICA_LIVE_S, REPLICA_FORGET_S)
        return 1 + int(rows[0][0])

    async def forget(self, replica: str) -> None:
        await self._fetch(FORGET, replica)

    async def close(self) -> None:
        if self._pool is not None:
            pool, self._pool = self._pool, None
            try:
                async with asyncio.timeout(self.timeout_s):
                    await pool.close()
            except _DOWN:
                pool.terminate()
