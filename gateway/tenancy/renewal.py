"""The ledger side of an admission (store.py): its verdict, its purge and reads, and an
allowance's renewal (allowance.py): one admission transaction, run in the background, that
takes the next allowance if every budget and the cap still have room for one of the same
size. The old allowance stays usable while it runs, and keeps the requests admitted from it;
the caller retires it after (it goes back with their rows at the next flush)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from accounting.ledger import reservation_schema as reservations
from accounting.ledger import sql
from accounting.ledger.budget_store import Batch, BudgetStore, Query, lock_key
from core.vocab import value_type
from gateway.config import Tenant
from gateway.tenancy.allowance import Allowance, size
from gateway.tenancy.budget import Cost, Rates, Spend, choose_precision, spends

REPLICA_LIVE_S = 10.0  # as the apportioner's REPLICA_STALE_S
NEW_REPLICA_S = 30.0  # a reservation this young counts as open whatever its replica published


@value_type  # one per admission
class StoreVerdict:
    allowed: bool
    reason: str = ""  # "budget" or "concurrency" when refused
    precision: str = ""  # the precision the estimate fits at
    cost: Cost = field(default_factory=Cost)
    standing: tuple[Spend, ...] = ()
    open_now: int = 0  # the tenant's requests in flight
    settled_last: int | None = None  # last interval of its finished requests not yet final


@dataclass(slots=True)
class Ask:
    """A request waiting for its tenant's next admission transaction."""

    tenant: Tenant
    request_id: str
    prompt_tokens: float
    output_tokens: float
    first: str
    cheaper: Sequence[str]
    rates: Mapping[str, Rates]
    future: asyncio.Future[StoreVerdict]


def admission_reads(name: str, now: float, since: int, ttl_s: float) -> list[Query]:
    """An admission's queries: purge what no longer holds (final, or older than `ttl_s`),
    then read the tenant's hours since `since` and what its reservations hold."""
    return [
        (reservations.PURGE_FINAL, (name,)),
        (reservations.PURGE_EXPIRED, (name, now - ttl_s)),
        (sql.SELECT_TENANT_HOURS, (name, since)),
        (reservations.SELECT_HELD_TOTALS, (now - REPLICA_LIVE_S, now - NEW_REPLICA_S, name)),
    ]


def held_of(row: Sequence[Any]) -> tuple[Cost, int]:
    """What a tenant's reservations hold and how many of its requests are open, from the
    row of SELECT_HELD_TOTALS."""
    energy, carbon, cost, open_n = row[:4]
    return Cost(float(energy), float(carbon), float(cost)), int(open_n)


def decide_asks(asks: Sequence[Ask], rows: list[list[tuple[Any, ...]]], replica: str,
                replicas: int, now: float, new_id: str
                ) -> tuple[list[StoreVerdict], Allowance | None, list[Batch]]:
    """An admission transaction's decisions on one tenant's `asks`, from its reads
    (`admission_reads`' rows): each ask's verdict, in order, against what the ones before it
    reserved; the allowance to take (`new_id`) where every one was admitted at its first
    precision and there is room for one of the last one's size; and the writes."""
    name = asks[0].tenant.name
    verdicts: list[StoreVerdict] = []
    held, open_now = held_of(rows[3][0])
    last = rows[3][0][4]
    settled_last = None if last is None else int(last)
    inserts: list[tuple[Any, ...]] = []
    for a in asks:
        standing = tuple(spends(a.tenant.budgets.budgets, rows[2], held, now))
        cap = a.tenant.limits.max_concurrent
        if cap is not None and open_now >= cap:
            verdicts.append(StoreVerdict(False, "concurrency", standing=standing))
            continue
        chosen = choose_precision(standing, a.prompt_tokens, a.output_tokens, a.first,
                                  a.cheaper, a.rates)
        if chosen is None:
            verdicts.append(StoreVerdict(False, "budget", standing=standing,
                                         open_now=open_now, settled_last=settled_last))
            continue
        precision, c = chosen
        verdicts.append(StoreVerdict(True, precision=precision, cost=c, standing=standing))
        held, open_now = held.plus(c), open_now + 1
        inserts.append((a.request_id, name, replica, now, c.j, c.gco2e, c.usd))
    if not inserts:
        return verdicts, None, []
    out: list[Batch] = [(reservations.INSERT_RESERVATION, inserts)]
    last_ask, last_verdict = asks[-1], verdicts[-1]
    if len(inserts) == len(asks) and all(
            v.precision == a.first for a, v in zip(asks, verdicts, strict=True)):
        # every one admitted at its first precision: room for an allowance of its size?
        cap = last_ask.tenant.limits.max_concurrent
        n = size(spends(last_ask.tenant.budgets.budgets, rows[2], held, now),
                 last_verdict.cost, open_now, cap, replicas)
        if n:
            new = Allowance(name, new_id, replica, last_verdict.cost.times(n), n,
                            cap is not None, now, each=last_verdict.cost, n=n)
            out.append((reservations.UPSERT_ALLOWANCE, [new.row()]))
            return verdicts, new, out
    return verdicts, None, out


def successor(tenant: Tenant, old: Allowance, new_id: str, rows: Sequence[Sequence[Any]],
              hours: Sequence[tuple[int, float, float, float]], replicas: int, now: float
              ) -> Allowance | None:
    """The allowance to take after `old`, sized as `old` was, against the tenant's hours and
    held totals as read in the renewal (the old one's room still among them); None: no room
    for one."""
    held, open_now = held_of(rows[0])
    cap = tenant.limits.max_concurrent
    n = size(spends(tenant.budgets.budgets, hours, held, now), old.each, open_now, cap,
             replicas)
    if not n:
        return None
    return Allowance(old.tenant, new_id, old.replica, old.each.times(n), n, cap is not None,
                     now, each=old.each, n=n)


async def renew(ledger: BudgetStore, tenant: Tenant, old: Allowance, new_id: str,
                reads: Sequence[Query], replicas: int, now: float) -> Allowance | None:
    """Take `old`'s successor in one transaction under the tenant's lock; `reads`: the
    admission's purge and reads (store.py) as of `now`."""
    taken: list[Allowance] = []

    def decide(rows: list[list[tuple[Any, ...]]]) -> Sequence[Batch]:
        taken.clear()
        new = successor(tenant, old, new_id, rows[3], rows[2], replicas, now)
        if new is None:
            return ()
        taken.append(new)
        return [(reservations.UPSERT_ALLOWANCE, [new.row()])]

    await ledger.locked(lock_key(tenant.name), reads, decide)
    return taken[0] if taken else None
