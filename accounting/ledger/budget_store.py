"""What tenant controls need of the ledger (`BudgetStore`): budgets' spend per hour, the
reservations held against them, each tenant's recent bills, the live replicas, and one
locked transaction to reserve in. The ledger's stores (SQLite, PostgreSQL) serve both this
and the accounting `Ledger` protocol (base.py); the gateway's tenancy sees only this one."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Sequence
from typing import Any, Protocol

Batch = tuple[str, Sequence[Sequence[Any]]]  # a statement and its parameter rows
Query = tuple[str, tuple[Any, ...]]
# Given the rows of a locked transaction's queries, the writes that complete it.
Decide = Callable[[list[list[tuple[Any, ...]]]], Sequence[Batch]]


@functools.lru_cache(maxsize=4096)  # asked per admission; a hash each time showed in profiles
def lock_key(tenant: str) -> int:
    """A stable signed 64-bit advisory-lock key per tenant (`BudgetStore.locked`)."""
    return int.from_bytes(hashlib.sha256(f"wattgate-tenant:{tenant}".encode()).digest()[:8],
                          "big", signed=True)


class BudgetStore(Protocol):
    async def open(self) -> None:
        """Connect and migrate the schema to the current version."""
        ...

    async def close(self) -> None: ...

    async def locked(self, key: int, queries: Sequence[Query], decide: Decide) -> None:
        """Under the transaction lock `key` (one per tenant): run `queries`, then the writes
        `decide` makes of their rows, in one transaction."""
        ...

    async def settle_reservations(self, changes: Sequence[tuple[str, Sequence[Any] | None]],
                                  before: Sequence[Query] = ()) -> None:
        """In one transaction: the statements `before` first, then, in the order given,
        settle reservations (request id and its reservation_schema.SETTLE_RESERVATION row)
        and drop those of requests that no engine ran (request id and None)."""
        ...

    async def tenant_hours(self, tenant: str, since_hour: int
                           ) -> list[tuple[int, float, float, float]]:
        """(hour, J, gCO2e, USD) the tenant was billed per hour since `since_hour`."""
        ...

    async def reservations_held(self, tenant: str, young_s: float, live_s: float,
                                expired_s: float) -> tuple[float, float, float, int]:
        """(J, gCO2e, USD) held by a tenant's live reservations, and how many are open."""
        ...

    async def live_replicas(self, seen_after_s: float) -> int:
        """Gateway replicas heard from at or after `seen_after_s`."""
        ...

    async def tenant_bills(self, tenant: str, since_s: float, interval_s: float, limit: int
                           ) -> list[tuple[str, int, int, float, float, float]]:
        """A tenant's latest `limit` final requests: (precision, prompt tokens, completion
        tokens, J, gCO2e, USD) each."""
        ...

