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
while a request of the tenant waits for a transaction), and stays in it (`pending`, its
estimate and slot part of the allowance's row) until the allowance is given back: then, in the
transaction that deletes the allowance, the requests still running get a row of their own and
those that ended are written settled, one row per engine and last interval holding the sum
of their settlements (purged together, once that interval is final), so a request that ends
within the allowance's life costs the ledger no write of its own and the ledger never holds
it twice nor not at all. A request it has no room for goes to a transaction, which first gives
the allowance back (its unused room goes back), then decides against exact totals, so
admission near a limit stays exact. The flush gives an allowance back once it is LIFE_S old,
used or not; a crashed replica's expires as its reservations do (`reservation_ttl_s`).

Renewal: once an allowance has RENEW_SHARE of its slots or of its life left, the admission
that finds it so starts a transaction in the background that takes the next allowance, sized
as the first, under another id; requests go on being admitted from the old one meanwhile, so
none waits for it. Once it commits the new one admits and the old one is retired: the next
flush (or the tenant's next admission transaction) gives it back with the rows of the requests
admitted from it. While the old and the new allowance are both in the ledger both count as
held (a short overlap erring on the side of holding). A flush leaves an allowance under
renewal alone, and an admission transaction of its tenant waits for the renewal to end, so
one transaction at a time decides on an allowance.

Until the allowance goes back (at the flush after its renewal, LIFE_S after it was taken at
the latest) a request that ended still holds in it the estimate it was admitted at (which
counts all of its max_tokens, so it is seldom below the estimate it settles to) and, for a
capped tenant, its slot: a cap or a budget errs on the side of holding for that while.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
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

    def give_back(self, settled: Mapping[str, Sequence[Any] | None]) -> list[Query]:
        """Write the rows of the requests admitted from it and delete it (what is left of
        it goes back): `pending_rows` of them, then the allowance's DELETE, in one list."""
        pending, self.pending = self.pending, []
        return [*pending_rows(self.tenant, self.replica, pending, settled),
                (reservations.DELETE_RESERVATION, (self.request_id,))]


Pending = list[tuple[str, float, Cost]]


def pending_rows(tenant: str, replica: str, pending: Pending,
                 settled: Mapping[str, Sequence[Any] | None]) -> list[Query]:
    """The rows of requests admitted from an allowance, as it goes back: a request still
    running gets a reservation of its own at its estimate; one in `settled` (its
    SETTLE_RESERVATION row; None: no engine ran it, no row) ended, and those that ended on
    one engine in one last interval share one settled row holding their estimates' sum
    (created as the latest of them: it expires no earlier than any would have), which the
    admission's purge deletes once that interval is final, as it would have deleted each.
    A group of one is the request's own row; a larger one is named after its first request
    (`settled:<id>:<count>`), so a flush retried after a failure writes it under the same
    name, and no request's own id names a row holding others."""
    out: list[Query] = []
    groups: dict[tuple[Any, Any], list[tuple[str, float, Sequence[Any]]]] = {}
    for rid, at, c in pending:
        if rid not in settled:
            out.append((reservations.INSERT_RESERVATION, (
                rid, tenant, replica, at, c.j, c.gco2e, c.usd)))
        elif (row := settled[rid]) is not None:
            groups.setdefault((row[3], row[4]), []).append((rid, at, row))
    for (engine, last), members in groups.items():
        first = members[0][0]
        name = first if len(members) == 1 else f"settled:{first}:{len(members)}"
        out.append((reservations.INSERT_SETTLED, (
            name, tenant, replica, max(at for _, at, _ in members),
            math.fsum(row[0] for _, _, row in members),
            math.fsum(row[1] for _, _, row in members),
            math.fsum(row[2] for _, _, row in members), engine, last)))
    return out


Settlement = tuple[Any, ...] | None  # a SETTLE_RESERVATION row; None: no engine ran it


class Unwritten:
    """The requests admitted from allowances whose rows are not in the ledger yet (`ids`),
    and the settlements of those of them that ended, kept for their rows (`settled`)."""

    __slots__ = ("ids", "settled")

    def __init__(self) -> None:
        self.ids: set[str] = set()
        self.settled: dict[str, Settlement] = {}

    def settle(self, request_id: str, row: Settlement) -> bool:
        """Keep `request_id`'s settlement for its row; False: its row is written already."""
        if request_id not in self.ids:
            return False
        self.settled[request_id] = row
        return True

    def consumed(self, written: Iterable[tuple[str, str]]) -> set[str]:
        """Of the requests ((tenant, request id) each) whose rows are about to be written,
        those that are written settled (or not at all: no engine ran them)."""
        return {rid for _, rid in written if rid in self.settled}

    def wrote(self, written: Iterable[tuple[str, str]], consumed: Collection[str]
              ) -> list[tuple[str, str, Settlement]]:
        """Their rows committed: the settlements to queue, of those written running that
        ended meanwhile, as (tenant, request id, settlement)."""
        out = []
        for tenant, rid in written:
            self.ids.discard(rid)
            if rid in self.settled:
                row = self.settled.pop(rid)
                if rid not in consumed:
                    out.append((tenant, rid, row))
        return out


def flush_allowances(allowances: dict[str, Allowance], now_s: float, give_back: bool,
                     settled: Mapping[str, Sequence[Any] | None],
                     renewing: Collection[str] = (), retired: Sequence[Allowance] = ()
                     ) -> tuple[list[Query], list[tuple[Allowance, Pending]]]:
    """A flush's statements for the allowances (tenant -> its; those of the tenants in
    `renewing` left alone) and the `retired` ones, in tenant order: the retired ones and
    those LIFE_S old (all, with `give_back`) given back with their requests' rows (settled
    where `settled` has them) and dropped from `allowances`; the others keep their requests.
    With each allowance given back and the requests it held, so a flush that fails can put
    them back."""
    before: list[Query] = []
    moved: list[tuple[Allowance, Pending]] = []
    current = [(name, a) for name, a in allowances.items() if name not in renewing and (
        give_back or now_s - a.taken_s >= LIFE_S)]
    for name, a in sorted([*current, *((a.tenant, a) for a in retired)], key=lambda x: x[0]):
        if allowances.get(name) is a:
            del allowances[name]
        pending = a.pending
        before += a.give_back(settled)
        moved.append((a, pending))
    return before, moved
