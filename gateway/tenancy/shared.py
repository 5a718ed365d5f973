"""Tenant rate limits kept for every replica at once in the shared store, admitted locally.

Each rate-limited tenant's limits (requests per second and per minute, tokens per minute) are
one bucket each in the store (rate_store.py), and each replica holds a lease of each
(lease.py). A request is admitted from its replica's leases without waiting when they hold
what it needs; leases are topped up and surpluses given back by one background task, in one
statement for all tenants. A request that finds a lease short waits for one lease of its
tenant's (requests short at the same time share it); one that finds the store empty is
refused here until the bucket has refilled.

When the store does not answer (unreachable, or slower than `timeout_s`), `on_store_down`
decides: `open` admits against this replica's own buckets at limit / N (N: the live replicas
the store last counted), `closed` refuses with 503 `rate_limit_store_unavailable`. The store
is tried again every PROBE_S; leases resume once it answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from core.errors import OverloadedError
from core.tasks import cancel_and_wait
from gateway.tenancy.config import SharedStoreConfig, TenantLimits
from gateway.tenancy.lease import Exchange, Lease
from gateway.tenancy.metrics import TenancyMetrics
from gateway.tenancy.rate_store import Ask, BucketStore, RateStore, RateStoreError
from gateway.tenancy.ratelimit import TenantRateLimiter, Verdict, duration_text

log = logging.getLogger("wattgate.tenancy")

SYNC_S = 0.05  # top-ups and give-backs at most this long after they are due
HEARTBEAT_S = 1.0  # this replica stamps itself live and counts the live ones this often
PROBE_S = 0.5  # a store that did not answer is tried again this often
JOIN_TRIES = 2  # leases a short request waits for at most (one in flight, then its own)


def leases_of(limits: TenantLimits) -> dict[str, Lease]:
    """A tenant's leases by limit key: `rps`, `rpm`, `tpm`."""
    periods = (("rps", limits.requests_per_second, 1.0),
               ("rpm", limits.requests_per_minute, 60.0),
               ("tpm", limits.tokens_per_minute, 60.0))
    return {key: Lease(limit, period_s) for key, limit, period_s in periods if limit is not None}


def reason_of(key: str) -> str:
    return "tokens" if key == "tpm" else "requests"


@dataclass(frozen=True, slots=True)
class Taken:
    verdict: Verdict
    headers: dict[str, str]
    local: bool = False  # taken from this replica's own buckets (the store down, open)


class SharedRates:
    def __init__(self, cfg: SharedStoreConfig, limits: Mapping[str, TenantLimits],
                 replica: str, *, clock: Callable[[], float],
                 metrics: TenancyMetrics | None = None, store: BucketStore | None = None):
        self.cfg = cfg
        self.replica = replica
        self.clock = clock
        self.metrics = metrics
        self.store: BucketStore = store or RateStore(cfg.dsn, cfg.timeout_s)
        self.leases = {tenant: leases_of(lim) for tenant, lim in limits.items()}
        self.up = False
        self.told = False  # whether the log has said the store is up or down (once at start)
        self.replicas = 1
        self.on_replicas: Callable[[int], None] = lambda _n: None
        self._inflight: dict[str, asyncio.Task[None]] = {}
        self._kick = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # -- the request path

    async def take(self, tenant: str, fallback: TenantRateLimiter, now_s: float, tokens: int
                   ) -> Taken:
        """Take one request and `tokens` tokens from `tenant`'s leases, or refuse."""
        leases = self.leases.get(tenant)
        if not leases:  # a cap on requests in flight only: nothing to lease
            return Taken(fallback.take(now_s, tokens), {})
        if not self.up:
            return self._without_store(fallback, now_s, tokens)
        needs = [(key, lease, float(tokens) if key == "tpm" else 1.0)
                 for key, lease in leases.items()]
        for key, lease, need in needs:
            if need > lease.capacity:
                return self._taken(tenant, Verdict(False, reason_of(key), math.inf), now_s)
        for _, lease, need in needs:
            lease.note(now_s, need)
        for _ in range(JOIN_TRIES):
            short = [(key, lease, need) for key, lease, need in needs if lease.balance < need]
            if not short or any(lease.empty_until_s > now_s for _, lease, _ in short):
                break
            if self.metrics is not None and self.metrics.rate_lease_waits is not None:
                self.metrics.rate_lease_waits.inc()
            await self._lease(tenant, {key: need for key, _, need in short})
            if not self.up:
                return self._without_store(fallback, self.clock(), tokens)
            now_s = self.clock()
        if any(lease.balance < need for _, lease, need in needs):
            wait_s, reason = max((lease.wait_s(now_s, need), reason_of(key))
                                 for key, lease, need in needs if lease.balance < need)
            return self._taken(tenant, Verdict(False, reason, wait_s), now_s)
        for _, lease, need in needs:
            lease.balance -= need
        if any(lease.wants_top_up(now_s) for _, lease, _ in needs):
            self._kick.set()
        return self._taken(tenant, Verdict(True), now_s)

    def _taken(self, tenant: str, verdict: Verdict, now_s: float) -> Taken:
        return Taken(verdict, self.headers(tenant, now_s))

    def _without_store(self, fallback: TenantRateLimiter, now_s: float, tokens: int) -> Taken:
        if self.cfg.on_store_down == "closed":
            raise OverloadedError(
                "the rate-limit store cannot be reached and this gateway refuses rate-limited "
                "requests until it can (on_store_down: closed); retry shortly",
                code="rate_limit_store_unavailable")
        return Taken(fallback.take(now_s, tokens), fallback.headers(now_s), local=True)

    def settle(self, tenant: str, reserved: int, used: int) -> None:
        """A request admitted from the leases reserved `reserved` tokens and used `used`."""
        lease = self.leases[tenant].get("tpm")
        if lease is not None:
            lease.balance += reserved - used

    def headers(self, tenant: str, _now_s: float) -> dict[str, str]:
        """OpenAI's `x-ratelimit-*` headers, of the whole limit, as this replica last saw
        the store (requests: the per-minute limit, else the per-second one)."""
        leases = self.leases[tenant]
        out: dict[str, str] = {}
        for name, lease in (("requests", leases.get("rpm") or leases.get("rps")),
                            ("tokens", leases.get("tpm"))):
            if lease is None:
                continue
            remaining = lease.remaining()
            out[f"x-ratelimit-limit-{name}"] = f"{math.floor(lease.capacity)}"
            out[f"x-ratelimit-remaining-{name}"] = f"{math.floor(remaining)}"
            out[f"x-ratelimit-reset-{name}"] = duration_text(
                (lease.capacity - remaining) / lease.rate_per_s)
        return out

    async def _lease(self, tenant: str, needs: dict[str, float]) -> None:
        """Wait for a lease of `tenant`'s: the one in flight, else one for `needs`."""
        task = self._inflight.get(tenant)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._fetch(tenant, needs))
            self._inflight[tenant] = task
            task.add_done_callback(lambda done: self._forget(tenant, done))
        # shielded: a client that leaves does not cancel what others wait for
        await asyncio.shield(task)

    def _forget(self, tenant: str, task: asyncio.Task[None]) -> None:
        if self._inflight.get(tenant) is task:
            del self._inflight[tenant]

    async def _fetch(self, tenant: str, needs: dict[str, float]) -> None:
        leases = self.leases[tenant]
        asks = {key: Ask(tenant, key, lease.capacity, lease.period_s,
                         lease.ask(needs.get(key, 0.0))) for key, lease in leases.items()}
        asks = {key: a for key, a in asks.items() if a.amount > 0.0}
        answers = await self._exchange(list(asks.values()))
        now_s = self.clock()
        for key in asks:
            answer = answers.get((tenant, key))
            if answer is not None:
                leases[key].granted(now_s, answer, asks[key].amount, needs.get(key, 0.0))

    async def _exchange(self, asks: list[Ask]) -> dict[tuple[str, str], Exchange]:
        """One statement for `asks`; nothing granted (and the store down) if it fails."""
        if not asks:
            return {}
        self._counted()
        try:
            return await self.store.exchange(asks)
        except RateStoreError as exc:
            self._lost(exc)
            return {}

    def _counted(self) -> None:
        if self.metrics is not None and self.metrics.rate_store_statements is not None:
            self.metrics.rate_store_statements.inc()

    # -- the background task

    async def sync(self, now_s: float) -> None:
        """Give back surpluses and top up low leases, in one statement for every tenant."""
        asks: list[Ask] = []
        for tenant, leases in self.leases.items():
            if tenant in self._inflight:
                continue
            for key, lease in leases.items():
                back = lease.surplus(now_s)
                if back > 0.0:  # gone from here at once: lost, not doubled, if the store fails
                    lease.balance -= back
                    asks.append(Ask(tenant, key, lease.capacity, lease.period_s, -back))
                elif lease.wants_top_up(now_s):
                    asks.append(Ask(tenant, key, lease.capacity, lease.period_s,
                                    lease.ask(0.0)))
        answers = await self._exchange(asks)
        now_s = self.clock()
        for a in asks:
            answer = answers.get((a.tenant, a.limit))
            if answer is not None:
                self.leases[a.tenant][a.limit].granted(now_s, answer, a.amount, 0.0)

    async def beat(self) -> None:
        """Stamp this replica live and count the live ones; a store that answers is up."""
        self._counted()
        try:
            self.replicas = await self.store.heartbeat(self.replica)
        except RateStoreError as exc:
            self._lost(exc)
            return
        self.on_replicas(self.replicas)
        if not self.up:
            self.up = self.told = True
            log.info("tenant controls: rate-limit store reachable; live replicas: %d",
                     self.replicas)
            self._gauge()

    def _lost(self, exc: RateStoreError) -> None:
        # said when it goes down, and when it is down from the start (a wrong DSN, a refused
        # password): else nothing but the 503s or the fallback share would tell
        if self.up or not self.told:
            self.up, self.told = False, True
            log.warning("tenant controls: rate-limit store down (%s); on_store_down: %s",
                        exc, self.cfg.on_store_down)
            self._gauge()

    def _gauge(self) -> None:
        if self.metrics is not None and self.metrics.rate_store_up is not None:
            self.metrics.rate_store_up.set(1.0 if self.up else 0.0)

    async def run(self) -> None:
        """Sync every SYNC_S (sooner when a request asks), beat every HEARTBEAT_S, and probe
        every PROBE_S while the store is down; until cancelled."""
        next_beat_s = self.clock() + HEARTBEAT_S
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(SYNC_S):
                    await self._kick.wait()
            self._kick.clear()
            now_s = self.clock()
            if self.up:
                await self.sync(now_s)
            if now_s >= next_beat_s:
                await self.beat()
                next_beat_s = now_s + (HEARTBEAT_S if self.up else PROBE_S)

    async def start(self) -> None:
        """Reach the store once (a store down at start is tried again in the background)."""
        self._gauge()
        await self.beat()
        self._task = asyncio.get_running_loop().create_task(self.run())

    async def stop(self) -> None:
        """Give every lease back, leave the live replicas, close."""
        await cancel_and_wait(self._task)
        self._task = None
        if self.up:
            for leases in self.leases.values():
                for lease in leases.values():
                    lease.seen_s = -math.inf  # idle: its surplus is all of it
            await self.sync(self.clock())
        # tried even when the store was last seen down: it may be back since the last probe,
        # and a replica that stays counted live shrinks the others' fallback share
        with contextlib.suppress(RateStoreError):
            await self.store.forget(self.replica)
        await self.store.close()
