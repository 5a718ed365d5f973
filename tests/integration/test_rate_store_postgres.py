"""The shared rate-limit store's SQL on a real PostgreSQL: the statement does lease.py's
arithmetic, concurrent leases of three replicas (naming the buckets in opposite orders) grant
each bucket exactly once, and live replicas are counted."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from gateway.tenancy.rate_store import REPLICA_FORGET_S, Ask, RateStore
from tests.support.postgres import postgres_server

pytestmark = [pytest.mark.timeout(180), pytest.mark.postgres]
HOUR_S = 3600.0  # refills so slowly that a test's seconds add almost nothing


async def test_a_lease_is_granted_what_the_bucket_holds_and_given_back_up_to_full() -> None:
    with postgres_server() as dsn:
        store = RateStore(dsn, 5.0)
        try:
            first = await store.exchange([Ask("a", "rpm", 100.0, HOUR_S, 30.0),
                                          Ask("a", "tpm", 1000.0, HOUR_S, 2000.0)])
            assert first[("a", "rpm")].granted == 30.0
            assert first[("a", "rpm")].level == 70.0
            assert first[("a", "tpm")].granted == 1000.0  # a new bucket is full, no more
            again = (await store.exchange([Ask("a", "rpm", 100.0, HOUR_S, 90.0)]))[("a", "rpm")]
            assert again.granted == pytest.approx(70.0, abs=0.01)
            back = (await store.exchange([Ask("a", "rpm", 100.0, HOUR_S, -500.0)]))[("a", "rpm")]
            assert back.granted == 0.0 and back.level == 100.0  # at most full
            assert await store.heartbeat("r1") == 1
            other = RateStore(dsn, 5.0)
            assert await other.heartbeat("r2") == 2
            await other.forget("r2")
            await other.close()
            assert await store.heartbeat("r1") == 1
        finally:
            await store.close()


async def test_concurrent_leases_of_three_replicas_grant_the_bucket_once() -> None:
    with postgres_server() as dsn:
        stores = [RateStore(dsn, 10.0) for _ in range(3)]
        try:
            buckets = [("t1", "rpm"), ("t2", "rpm"), ("t3", "tpm")]

            async def lease(i: int) -> float:
                order = buckets if i % 2 else buckets[::-1]  # opposite orders
                got = await stores[i % 3].exchange([Ask(t, k, 50.0, HOUR_S, 1.0)
                                                    for t, k in order])
                return sum(e.granted for e in got.values())

            granted = await asyncio.gather(*(lease(i) for i in range(120)))
            # 3 buckets of 50: 150 granted of the 360 asked, plus a test's refill
            assert 150.0 <= sum(granted) <= 150.0 + 3 * 50.0 / HOUR_S * 60
        finally:
            for s in stores:
                await s.close()


async def test_a_replica_row_left_by_a_killed_replica_is_deleted_by_the_next_heartbeat() -> None:
    """A replica killed without its stop leaves its row; another's heartbeat deletes rows
    unseen for REPLICA_FORGET_S, and keeps the fresh ones."""
    with postgres_server() as dsn:
        store = RateStore(dsn, 5.0)
        try:
            assert await store.heartbeat("live") == 1
            conn = await asyncpg.connect(dsn)
            try:
                await conn.execute("INSERT INTO rate_limit_replicas (replica, seen_s) VALUES "
                                   "('killed', extract(epoch FROM now()) - $1::float8), "
                                   "('recent', extract(epoch FROM now()) - 5)",
                                   REPLICA_FORGET_S + 60.0)
                assert await store.heartbeat("live") == 2  # "recent" still counts live
                left = {r["replica"] for r in await conn.fetch(
                    "SELECT replica FROM rate_limit_replicas")}
            finally:
                await conn.close()
            assert left == {"live", "recent"}
        finally:
            await store.close()
