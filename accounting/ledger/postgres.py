"""PostgreSQL ledger (asyncpg) for several gateway replicas sharing one ledger.

Every replica appends requests and work; exactly one apportions, the holder of a session-level
advisory lock on a dedicated connection. If that replica dies its connection closes, the
lock is freed and another replica takes over from the stored engine state.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import asyncpg

from accounting.ledger import sql
from accounting.ledger.base import LedgerError
from accounting.ledger.budget_store import Batch, Decide
from accounting.ledger.common import SqlLedger

APPORTIONER_LOCK = 0x7761_7474_6761_7465  # "wattgate" as a bigint key
MIGRATION_LOCK = APPORTIONER_LOCK - 1
# how long close waits for connections in use to be given back and closed before it cuts them
CLOSE_S = 5.0

log = logging.getLogger("wattgate.accounting")


class PostgresLedger(SqlLedger):
    kind = "postgres"

    def __init__(self, dsn: str, *, pool_size: int = 4):
        super().__init__()
        self._dsn = dsn
        self._pool_size = pool_size
        self._pool: Any = None
        self._lock_conn: Any = None
        self._held = False
        self._cache: dict[str, str] = {}

    def _q(self, query: str) -> str:
        out = self._cache.get(query)
        if out is None:
            out = self._cache[query] = sql.numbered(query)
        return out

    async def open(self) -> None:
        """Connect and migrate; on failure nothing stays open and a later open tries again."""
        if self._pool is not None:
            return
        try:
            self._pool = await asyncpg.create_pool(self._dsn, min_size=1,
                                                   max_size=self._pool_size)
            await self._migrate()
        # ValueError: a URL asyncpg refuses (`?sslmode=bogus`; its ClientConfigurationError)
        except (OSError, asyncpg.PostgresError, ValueError) as exc:
            await self.close()
            raise LedgerError(f"cannot open postgres ledger: {exc}") from exc
        except BaseException:
            await self.close()
            raise

    async def _migrate(self) -> None:
        async with self._live().acquire() as conn, conn.transaction():
            # Replicas starting together must not race on the schema.
            await conn.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK)
            await conn.execute(sql.CREATE_VERSION)
            current = await conn.fetchval(sql.GET_VERSION) or 0
            for version, statements in sql.schema("postgres"):
                if version <= current:
                    continue
                for statement in statements:
                    await conn.execute(statement)
                await conn.execute(self._q(sql.SET_VERSION), version)

    async def close(self) -> None:
        """Close the apportioner's connection and the pool, each within CLOSE_S: connections
        still in use then (a statement the server does not answer) are cut, not waited on."""
        try:
            await self.release_apportioner()
        finally:
            if self._pool is not None:
                pool, self._pool = self._pool, None
                await _close_pool(pool)

    def _live(self) -> Any:
        """The pool; a LedgerError (not an AttributeError) where the ledger is not open."""
        if self._pool is None:
            raise LedgerError("postgres ledger is not open")
        return self._pool

    async def _fetch(self, query: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        try:
            rows = await self._live().fetch(self._q(query), *params)
        except (OSError, asyncpg.PostgresError) as exc:
            raise LedgerError(f"postgres ledger: {exc}") from exc
        return [tuple(r) for r in rows]

    async def _snapshot(self, queries: Sequence[tuple[str, tuple[Any, ...]]]
                        ) -> list[list[tuple[Any, ...]]]:
        try:
            async with self._live().acquire() as conn, conn.transaction(
                    isolation="repeatable_read", readonly=True):
                return [[tuple(r) for r in await conn.fetch(self._q(q), *p)]
                        for q, p in queries]
        except (OSError, asyncpg.PostgresError) as exc:
            raise LedgerError(f"postgres ledger: {exc}") from exc

    async def _transaction(self, batches: Sequence[Batch]) -> None:
        try:
            async with self._live().acquire() as conn, conn.transaction():
                for statement, rows in batches:
                    if rows:
                        await conn.executemany(self._q(statement), rows)
        except (OSError, asyncpg.PostgresError) as exc:
            raise LedgerError(f"postgres ledger: {exc}") from exc

    async def _locked(self, key: int, queries: Sequence[tuple[str, tuple[Any, ...]]],
                      decide: Decide) -> None:
        try:
            async with self._live().acquire() as conn, conn.transaction():
                # Released at the end of the transaction: admissions of one key take turns
                # across every replica.
                await conn.execute("SELECT pg_advisory_xact_lock($1)", key)
                rows = [[tuple(r) for r in await conn.fetch(self._q(q), *p)] for q, p in queries]
                for statement, params in decide(rows):
                    if params:
                        await conn.executemany(self._q(statement), params)
        except (OSError, asyncpg.PostgresError) as exc:
            raise LedgerError(f"postgres ledger: {exc}") from exc

    async def acquire_apportioner(self) -> bool:
        conn = self._lock_conn
        if conn is not None and conn.is_closed():
            conn = self._lock_conn = None
            self._held = False
        if self._held:
            return True
        try:
            if conn is None:
                conn = self._lock_conn = await asyncpg.connect(self._dsn)
            self._held = bool(await conn.fetchval("SELECT pg_try_advisory_lock($1)",
                                                  APPORTIONER_LOCK))
        except (OSError, asyncpg.PostgresError) as exc:
            raise LedgerError(f"postgres ledger: advisory lock: {exc}") from exc
        return self._held

    async def release_apportioner(self) -> None:
        self._held = False
        if self._lock_conn is not None:
            conn, self._lock_conn = self._lock_conn, None
            if not conn.is_closed():
                try:  # closing the session frees its advisory locks
                    await conn.close(timeout=CLOSE_S)
                except (OSError, TimeoutError, asyncpg.PostgresError) as exc:
                    # asyncpg has cut the connection: the server ends the session all the same
                    log.warning("postgres ledger: apportioner connection cut: %r", exc)


async def _close_pool(pool: Any) -> None:
    """Close `pool` gracefully within CLOSE_S, else cut its connections (`terminate`)."""
    try:
        await asyncio.wait_for(pool.close(), CLOSE_S)
    except (OSError, TimeoutError, asyncpg.PostgresError) as exc:
        log.warning("postgres ledger: connections cut on close: %r", exc)
        pool.terminate()
