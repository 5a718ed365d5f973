"""Allowances: room a replica reserves in the ledger ahead of its next requests of a tenant,
so a budget (or concurrency cap) far from its limit admits without a ledger transaction per
request; near the limit there is none and every request is decided in the ledger as before.

An allowance is one row of `reservations` (id `allowance:<replica>:<holder>:<tenant>:<n>`, one
per process that holds it, no engine): it
holds what `n` requests of the size of the one that took it would hold (and `n` of the cap's
slots where the tenant has a cap), so every replica's admission counts it as held. It is
taken in an admission transaction that admitted every request of its batch, only while each
budget and the cap keep room for HEADROOM x replicas allowances of that size: it is a small
share of what is left. A request admitted from it is decided here in arrival order (none is
while a request of the tenant waits for a transaction); its own reservation row is written
later, by the flush or the tenant's next transaction, in the same transaction that takes its
estimate (and slot) out of the allowance, so the ledger never holds it twice nor not at all.
A request it has no room for goes to a transaction, which first moves those rows out and
deletes the allowance (its room goes back), then decides against exact totals, so admission
near a limit stays exact. The flush gives an allowance back once it is LIFE_S old, used or
not; a crashed replica's expires as its reservations do (`reservation_ttl_s`).

Renewal: once an allowance has RENEW_SHARE of its slots or of its life left, the admission
that finds it so starts a transaction in the background that writes the rows admitted from
it so far (taken out of it) and takes the next allowance, sized as the first, under another
id; requests go on being admitted from the old one meanwhile, so none waits for it. Once it
commits the new one admits and the old one is retired: the next flush (or the tenant's next
admission transaction) writes the rows of the requests admitted from it during the renewal
and deletes it (what is left goes back). Each request's row is written once, by whichever
transaction took it out of `pending`, in the same statement list that takes it out of its
own allowance; while the old and the new allowance are both in the ledger both count as
held (a short overlap erring on the side of holding). A flush leaves an allowance under
renewal alone, and an admission transaction of its tenant waits for the renewal to end, so
one transaction at a time moves an allowance's rows.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from accounting.ledger import reservation_schema as reservations
from accounting.ledger.budget_store import Query
from gateway.tenancy.budget import Cost, Spend

MAX_REQUESTS = 256  # the most requests one allowance holds room for: one in this many waits for a transaction
MIN_REQUESTS = 8  # room for fewer: none, the requests are decided in the ledger one by one
HEADROOM = 16  # taken only while there is room for this many x replicas allowances
LIFE_S = 0.25  # given back by the flush once this old
RENEW_SHARE = 0.25  # renewed in the background once this share of its slots or life is left


def allowance_id(tenant: str, replica: str, holder: str, generation: int) -> str:
    """The row id of the allowance `holder` (one TenancyStore: the workers of a node share
    their replica name, and each holds allowances of its own) takes for `tenant`; its
    `generation`-th, so a renewal's is not the one it renews."""
    return f"allowance:{replica}:{holder}:{tenant}:{generation}"


def size(standing: Sequence[Spend], each: Cost, open_now: int, cap: int | None,
         replicas: int) -> int:
    """How many requests costing `each` an allowance taken now may hold (0: none)."""
    share = HEADROOM * max(1, replicas)
    n = MAX_REQUESTS
    for s in standing:
        unit = each.of(s.budget.unit)
        if unit > 0:
            n = min(n, math.floor(s.remaining / (share * unit)))
    if cap is not None:
        n = min(n, (cap - open_now) // share)
    return n if n >= MIN_REQUESTS else 0


@dataclass(slots=True)
class Allowance:
    tenant: str
    request_id: str
    replica: str
    free: Cost  # what requests admitted from it may still take
    slots: int  # how many more may be admitted from it
    capped: bool  # its slots count against the tenant's concurrency cap
    taken_s: float
    each: Cost = field(default_factory=Cost)  # the request it was sized by (its renewal's too)
    n: int = 0  # the slots it was taken with
    renewable: bool = True  # False once a renewal of it found no room or failed
    # admitted from it, their rows not written yet: (request id, admitted at, estimate)
    pending: list[tuple[str, float, Cost]] = field(default_factory=list)

    def take(self, request_id: str, cost: Cost, now_s: float) -> bool:
        """Admit a request costing `cost` from it, if it has room and is not due back."""
        free = self.free
        if self.slots < 1 or now_s - self.taken_s >= LIFE_S or cost.j > free.j \
                or cost.gco2e > free.gco2e or cost.usd > free.usd:
            return False
        self.free = Cost(free.j - cost.j, free.gco2e - cost.gco2e, free.usd - cost.usd)
        self.slots -= 1
        self.pending.append((request_id, now_s, cost))
        return True

    def due(self, now_s: float) -> bool:
        """Whether to renew it now: RENEW_SHARE of its slots or of its life left."""
        return self.renewable and (self.slots <= self.n * RENEW_SHARE
                                   or now_s - self.taken_s >= LIFE_S * (1.0 - RENEW_SHARE))

    def row(self) -> tuple[Any, ...]:
        """Its reservation row as taken (UPSERT_ALLOWANCE's parameters)."""
        return (self.request_id, self.tenant, self.replica, self.taken_s, self.free.j,
                self.free.gco2e, self.free.usd, self.slots if self.capped else 0)

    def moves(self, pending: Sequence[tuple[str, float, Cost]],
              settled: Mapping[str, Sequence[Any] | None] | None = None) -> list[Query]:
        """The statements that write `pending`'s rows and take them out of the allowance;
        a request in `settled` (its SETTLE_RESERVATION row; None: no engine ran it) has
        ended already: its row is written settled (none if no engine ran it), so a request
        that starts and ends between two flushes costs the ledger one write, not two."""
        settled = settled or {}
        out: list[Query] = []
        for rid, at, c in pending:
            if rid not in settled:
                out.append((reservations.INSERT_RESERVATION, (
                    rid, self.tenant, self.replica, at, c.j, c.gco2e, c.usd)))
            elif (row := settled[rid]) is not None:
                j, g, usd, engine, last, _ = row
                out.append((reservations.INSERT_SETTLED, (
                    rid, self.tenant, self.replica, at, j, g, usd, engine, last)))
        if pending:
            out.append((reservations.SHRINK_ALLOWANCE, (
                math.fsum(c.j for _, _, c in pending), math.fsum(c.gco2e for _, _, c in pending),
                math.fsum(c.usd for _, _, c in pending), len(pending) if self.capped else 0,
                self.request_id)))
        return out

    def give_back(self, settled: Mapping[str, Sequence[Any] | None] | None = None
                  ) -> list[Query]:
        """Write the pending rows and delete the allowance (what is left of it goes back)."""
        pending, self.pending = self.pending, []
        return [*self.moves(pending, settled),
                (reservations.DELETE_RESERVATION, (self.request_id,))]


Pending = list[tuple[str, float, Cost]]


def flush_allowances(allowances: dict[str, Allowance], now_s: float, give_back: bool,
                     settled: Mapping[str, Sequence[Any] | None],
                     renewing: Collection[str] = (), retired: Sequence[Allowance] = ()
                     ) -> tuple[list[Query], list[tuple[Allowance, Pending, bool]]]:
    """A flush's statements for the allowances (tenant -> its; those of the tenants in
    `renewing` left alone) and the `retired` ones, in tenant order: their pending rows
    written (settled where `settled` has them) and taken out of them, and the retired ones,
    those LIFE_S old (all, with `give_back`) given back and dropped from `allowances`; with
    what each moved and whether it went, so a flush that fails can put them back."""
    before: list[Query] = []
    moved: list[tuple[Allowance, Pending, bool]] = []
    current = [(name, a) for name, a in allowances.items() if name not in renewing]
    for name, a in sorted([*current, *((a.tenant, a) for a in retired)], key=lambda x: x[0]):
        pending = a.pending
        if allowances.get(name) is not a or give_back or now_s - a.taken_s >= LIFE_S:
            if allowances.get(name) is a:
                del allowances[name]
            before += a.give_back(settled)
            moved.append((a, pending, True))
        elif pending:
            a.pending = []
            before += a.moves(pending, settled)
            moved.append((a, pending, False))
    return before, moved
