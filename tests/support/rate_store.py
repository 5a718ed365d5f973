"""The shared rate-limit store in memory, on a fake clock, for tests of `SharedRates`."""

from __future__ import annotations

from collections.abc import Sequence

from gateway.tenancy.lease import Exchange, exchange
from gateway.tenancy.rate_store import Ask, RateStoreError


class Clock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


class MemoryStore:
    """The store's buckets in memory, answering at once on the fake clock."""

    def __init__(self, clock: Clock):
        self.clock = clock
        self.buckets: dict[tuple[str, str], tuple[float, float]] = {}
        self.live: set[str] = set()
        self.down = False
        self.statements = 0

    async def exchange(self, asks: Sequence[Ask]) -> dict[tuple[str, str], Exchange]:
        if self.down:
            raise RateStoreError("connection refused")
        self.statements += 1
        out: dict[tuple[str, str], Exchange] = {}
        now = self.clock()
        for a in asks:
            key = (a.tenant, a.limit)
            level, at_s = self.buckets.get(key, (a.capacity, now))
            out[key] = exchange(level, at_s, now, a.capacity, a.period_s, a.amount)
            self.buckets[key] = (out[key].level, max(at_s, now))
        return out

    async def heartbeat(self, replica: str) -> int:
        if self.down:
            raise RateStoreError("connection refused")
        self.live.add(replica)
        return len(self.live)

    async def forget(self, replica: str) -> None:
        self.live.discard(replica)

    async def close(self) -> None:
        pass
