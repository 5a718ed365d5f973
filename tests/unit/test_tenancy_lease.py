"""Leases of shared rate-limit buckets: the store's arithmetic and a replica's lease (pure, on
a fake clock), then three replicas' `SharedRates` on one in-memory store driven through
simulated seconds of traffic: together they admit what one bucket of the limit admits."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from core.errors import OverloadedError
from gateway.tenancy.config import OnStoreDown, SharedStoreConfig, TenantLimits
from gateway.tenancy.lease import HORIZON_S, IDLE_RETURN_S, Exchange, Lease, exchange
from gateway.tenancy.ratelimit import TenantRateLimiter
from gateway.tenancy.shared import HEARTBEAT_S, SYNC_S, SharedRates
from tests.support.rate_store import Clock, MemoryStore


def test_the_store_grants_what_its_refilled_bucket_holds_and_takes_back_up_to_full() -> None:
    fresh = exchange(50.0, 0.0, 0.0, 50.0, 1.0, 20.0)
    assert fresh == Exchange(20.0, 30.0)
    # 0.2 s later 10 more are there: 40 of the 45 asked
    assert exchange(30.0, 0.0, 0.2, 50.0, 1.0, 45.0) == Exchange(40.0, 0.0)
    assert exchange(0.0, 0.0, 0.01, 50.0, 1.0, 5.0).granted == pytest.approx(0.5)
    # given back: the bucket holds at most its limit
    assert exchange(45.0, 0.0, 0.0, 50.0, 1.0, -10.0) == Exchange(0.0, 50.0)
    assert exchange(10.0, 0.0, 0.0, 50.0, 1.0, -10.0) == Exchange(0.0, 20.0)


def test_leases_shrink_to_one_request_near_the_limit() -> None:
    lease = Lease(1000.0, 1.0)
    for i in range(361):  # 360 requests a second
        lease.note(i / 360, 1.0)
    assert lease.demand_per_s == pytest.approx(360.0, rel=0.01)
    lease.store_level = 900.0
    assert lease.ask(1.0) == pytest.approx(36.0, rel=0.01)  # 100 ms of demand
    for i in range(361, 1000):
        lease.note(i / 360, 1.0)
        lease.note(i / 360, 1.0)
    assert lease.ask(1.0) == 50.0  # twice that: at most 5 % of the limit
    lease.store_level = 100.0  # the store is running low: a quarter of what it has
    assert lease.ask(1.0) == pytest.approx(25.0)
    assert lease.wants_top_up(1.0)
    for level in (40.0, 0.0):  # at the limit: what the bucket refills in 20 ms
        lease.store_level = level
        assert lease.ask(1.0) == pytest.approx(20.0)
        assert not lease.wants_top_up(1.0)  # and only for requests waiting
    slow = Lease(30.0, 1.0, store_level=0.0)  # that is less than a request: one request
    slow.note(0.0, 1.0)
    assert slow.ask(1.0) == 1.0


def test_a_replica_tops_up_before_its_lease_runs_out_far_from_the_limit() -> None:
    lease = Lease(1000.0, 1.0, balance=0.0, store_level=1000.0)
    for i in range(100):
        lease.note(i * 0.001, 1.0)
    assert lease.wants_top_up(0.1)
    lease.balance = lease.block()  # a full block: nothing to ask
    assert not lease.wants_top_up(0.1)


def test_an_empty_store_is_not_asked_again_until_it_has_refilled() -> None:
    lease = Lease(50.0, 1.0)
    lease.granted(10.0, Exchange(0.0, 0.0), asked=1.0, need=1.0)
    assert lease.empty_until_s == pytest.approx(10.02)  # one request refills in 1/50 s
    assert lease.wait_s(10.005, 1.0) == pytest.approx(0.015)
    assert lease.wait_s(10.0, 51.0) == math.inf
    lease.granted(10.02, Exchange(1.0, 0.0), asked=1.0, need=1.0)
    assert lease.balance == 1.0 and lease.empty_until_s == pytest.approx(10.02)
    fast = Lease(1000.0, 1.0)  # at its limit: asked again once 20 ms have refilled a block
    fast.granted(0.0, Exchange(3.0, 0.0), asked=20.0, need=1.0)
    assert fast.balance == 3.0 and fast.empty_until_s == pytest.approx(0.02)


def test_an_idle_lease_and_refunds_above_a_block_go_back() -> None:
    lease = Lease(60000.0, 60.0, balance=2000.0, store_level=50000.0)
    lease.note(0.0, 400.0)
    keep = 2.0 * max(lease.block(), lease.size)
    assert 0.0 < keep < 2000.0
    assert lease.surplus(0.5) == pytest.approx(2000.0 - keep)
    assert lease.surplus(IDLE_RETURN_S) == 2000.0  # untouched for a second: all of it
    assert Lease(10.0, 1.0, balance=-3.0).surplus(100.0) == 0.0  # a debt is not given back


def share_of(fallback: TenantRateLimiter) -> Callable[[int], None]:
    return lambda live: fallback.set_share(1.0 / live)


def replicas(n: int, store: MemoryStore, clock: Clock, limits: TenantLimits,
             on_store_down: OnStoreDown = "open") -> list[tuple[SharedRates, TenantRateLimiter]]:
    cfg = SharedStoreConfig(dsn="postgresql://memory", on_store_down=on_store_down)
    out = []
    for i in range(n):
        fallback = TenantRateLimiter(limits, clock())
        shared = SharedRates(cfg, {"a": limits}, f"r{i}", clock=clock, store=store)
        shared.on_replicas = share_of(fallback)
        out.append((shared, fallback))
    return out


async def drive(reps: list[tuple[SharedRates, TenantRateLimiter]], clock: Clock,
                weights: list[int], rate_per_s: float, duration_s: float, tokens: int = 0,
                start_s: float = 0.0) -> list[int]:
    """Requests at `rate_per_s` in all, replica i getting weights[i] of every sum(weights),
    each replica's background sync every SYNC_S: the admitted per replica."""
    plan = [i for i, w in enumerate(weights) for _ in range(w)]
    admitted = [0] * len(reps)
    next_sync_s = next_beat_s = start_s
    for k in range(int(rate_per_s * duration_s)):
        clock.now_s = start_s + k / rate_per_s
        while clock.now_s >= next_sync_s:  # as `SharedRates.run` does
            for shared, _ in reps:
                if shared.up:
                    await shared.sync(clock.now_s)
                if next_sync_s >= next_beat_s:
                    await shared.beat()
            next_beat_s += HEARTBEAT_S if next_sync_s >= next_beat_s else 0.0
            next_sync_s += SYNC_S
        i = plan[k % len(plan)]
        shared, fallback = reps[i]
        taken = await shared.take("a", fallback, clock.now_s, tokens)
        admitted[i] += taken.verdict.allowed
    return admitted


@pytest.mark.parametrize(("weights", "name"), [([1, 0, 0], "one replica"),
                                                ([8, 1, 1], "80/10/10"),
                                                ([1, 1, 1], "even")])
async def test_three_replicas_admit_one_bucket_of_the_limit_however_traffic_spreads(
        weights: list[int], name: str) -> None:
    clock, limit, duration_s = Clock(), 50.0, 10.0
    store = MemoryStore(clock)
    reps = replicas(3, store, clock, TenantLimits(requests_per_second=limit))
    for shared, _ in reps:
        await shared.beat()
    admitted = await drive(reps, clock, weights, 2 * limit, duration_s)
    expected = limit + limit * clock.now_s  # a full bucket, then its refill
    print(f"{name}: admitted {admitted} = {sum(admitted)}, one bucket {expected:.0f}; "
          f"{store.statements} statements for {int(2 * limit * duration_s)} requests")
    assert sum(admitted) == pytest.approx(expected, rel=0.02)
    assert sum(admitted) <= expected + 1e-9  # never more than the bucket holds
    assert all(a > 0 for a, w in zip(admitted, weights, strict=True) if w)  # none starved


async def test_far_from_the_limit_requests_do_not_wait_for_the_store() -> None:
    """Past the first HORIZON_S of a client's traffic, no request waits for a lease: the
    background task (run at once when a request leaves a lease low) keeps them topped up."""
    clock = Clock()
    store = MemoryStore(clock)
    (shared, fallback), = replicas(1, store, clock, TenantLimits(requests_per_second=1000.0))
    await shared.beat()
    waited, next_sync_s = [], 0.0
    for k in range(1000):  # 200 a second for 5 s
        clock.now_s = k / 200.0
        if clock.now_s >= next_sync_s or shared._kick.is_set():
            shared._kick.clear()
            await shared.sync(clock.now_s)  # as `SharedRates.run` does
            next_sync_s = clock.now_s + SYNC_S
        before = store.statements
        assert (await shared.take("a", fallback, clock.now_s, 0)).verdict.allowed
        if store.statements > before:  # this request waited for a lease
            waited.append(clock.now_s)
    print(f"requests that waited for a lease, at (s): {waited}; {store.statements} "
          "statements for 1000 requests")
    assert waited and max(waited) < HORIZON_S
    assert store.statements < 1000 / 10  # blocks of ~20 requests, not one per request


async def test_token_refunds_return_to_the_store_for_every_replica() -> None:
    clock = Clock()
    store = MemoryStore(clock)
    limits = TenantLimits(tokens_per_minute=6000.0)
    (shared, fallback), = replicas(1, store, clock, limits)
    await shared.beat()
    taken = await shared.take("a", fallback, 0.0, 1000)
    assert taken.verdict.allowed
    shared.settle("a", 1000, 100)  # used 100 of its 1000
    clock.now_s = 2 * IDLE_RETURN_S
    await shared.sync(clock.now_s)
    level, _ = store.buckets[("a", "tpm")]
    assert shared.leases["a"]["tpm"].balance == 0.0
    # the bucket lost 100 and refilled 2 s x 100/s, up to full
    assert level == pytest.approx(6000.0)
    refused = await shared.take("a", fallback, clock.now_s, 6001)
    assert refused.verdict.retry_after_s == math.inf and refused.verdict.reason == "tokens"


async def test_store_down_open_falls_back_to_a_share_and_recovers() -> None:
    clock = Clock()
    store = MemoryStore(clock)
    reps = replicas(3, store, clock, TenantLimits(requests_per_second=30.0))
    for shared, _ in reps:
        await shared.beat()
    await drive(reps, clock, [1, 1, 1], 60.0, 2.0)
    store.down = True
    start = clock.now_s + 0.5
    admitted = await drive(reps, clock, [1, 0, 0], 60.0, 3.0, start_s=start)
    shared, fallback = reps[0]
    assert not shared.up
    # its own bucket of 30 / 3: full at first, then 10 a second
    assert admitted[0] == pytest.approx(10 + 10 * (clock.now_s - start), abs=1)
    store.down = False
    await shared.beat()
    assert shared.up
    taken = await shared.take("a", fallback, clock.now_s + 1.0, 0)
    assert taken.verdict.allowed and not taken.local


async def test_store_down_closed_refuses_with_a_503() -> None:
    clock = Clock()
    store = MemoryStore(clock)
    (shared, fallback), = replicas(1, store, clock, TenantLimits(requests_per_minute=600.0),
                                   on_store_down="closed")
    await shared.beat()
    assert (await shared.take("a", fallback, 0.0, 0)).verdict.allowed
    store.down = True
    shared.leases["a"]["rpm"].balance = 0.0
    with pytest.raises(OverloadedError) as err:
        await shared.take("a", fallback, 0.1, 0)
    assert err.value.status == 503 and err.value.code == "rate_limit_store_unavailable"
    assert not shared.up
    with pytest.raises(OverloadedError):  # refused at once while down, no lease tried
        await shared.take("a", fallback, 0.2, 0)
